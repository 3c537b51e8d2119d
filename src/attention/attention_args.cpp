#include "attention/attention_args.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "sparsejit/error.h"

namespace sjit::attention {
namespace {

constexpr std::int64_t kMaxInt = 0x7fffffff;

struct TensorArg {
  const char* name;
  const void* ptr;
  Strides strides;
  std::int64_t heads, seq;
};

// Byte range [first, last) a strided tensor touches, for the overlap check.
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorArg& t, std::int64_t batch, int head_dim) {
  const std::int64_t last_element = (batch - 1) * t.strides.batch + (t.heads - 1) * t.strides.head +
                                    (t.seq - 1) * t.strides.row + head_dim;
  const auto first = reinterpret_cast<std::uintptr_t>(t.ptr);
  return {first, first + std::uintptr_t(last_element) * 2};
}

void check_tensor(const TensorArg& t, int head_dim) {
  if (t.ptr == nullptr) throw InvalidArgument(fmt::format("attention: {} is null", t.name));
  if (reinterpret_cast<std::uintptr_t>(t.ptr) % 16 != 0)
    throw InvalidArgument(fmt::format("attention: {} = {} is not 16-byte aligned: the kernels move 16-byte chunks",
                                      t.name, t.ptr));
  const std::int64_t s[] = {t.strides.batch, t.strides.head, t.strides.row};
  const char* which[] = {"batch", "head", "row"};
  for (int i = 0; i < 3; ++i) {
    if (s[i] < 0 || s[i] % 8 != 0)
      throw InvalidArgument(fmt::format("attention: {} {} stride = {} elements: strides must be non-negative multiples "
                                        "of 8 (16 bytes)", t.name, which[i], s[i]));
  }
  if (t.seq > 1 && t.strides.row < head_dim)
    throw InvalidArgument(fmt::format("attention: {} row stride = {} is less than head_dim = {}: rows would overlap",
                                      t.name, t.strides.row, head_dim));
}

Strides or_contiguous(const Strides& s, std::int64_t heads, std::int64_t seq, int head_dim) {
  return s == Strides{} ? Strides::bhsd(heads, seq, head_dim) : s;
}

}  // namespace

void check_pattern_fits_spec(const AttentionSpec& spec, const BlockPattern& pattern) {
  if (spec.sparsity == Sparsity::dense)
    throw InvalidArgument(fmt::format("attention: a pattern was given to the dense spec '{}': use sparsity=bsr",
                                      key(spec)));
  if (pattern.block_size() != spec.block_size)
    throw InvalidArgument(fmt::format("attention: the pattern has block size {} but the spec '{}' was made for {}",
                                      pattern.block_size(), key(spec), spec.block_size));
}

void check_pattern(const AttentionSpec& spec, const BlockPattern& pattern, std::int64_t heads_q, std::int64_t seq_q,
                   std::int64_t seq_k) {
  check_pattern_fits_spec(spec, pattern);
  const int bs = spec.block_size;
  if (pattern.heads() != 1 && pattern.heads() != heads_q)
    throw InvalidArgument(fmt::format("attention: the pattern has {} heads: use 1 (shared) or heads_q = {}",
                                      pattern.heads(), heads_q));
  const std::int64_t rows = (seq_q + bs - 1) / bs, cols = (seq_k + bs - 1) / bs;
  if (pattern.block_rows() != rows || pattern.block_cols() != cols)
    throw InvalidArgument(fmt::format("attention: the pattern is {} x {} blocks but seq_q = {}, seq_k = {} with block "
                                      "size {} need {} x {}", pattern.block_rows(), pattern.block_cols(), seq_q, seq_k,
                                      bs, rows, cols));
}

AttentionForwardArgs checked_forward_args(const AttentionSpec& spec, const AttentionForwardArgs& in,
                                          const BlockPattern* baked) {
  AttentionForwardArgs a = in;
  const int d = spec.head_dim;
  auto positive = [](const char* name, std::int64_t v, std::int64_t lo) {
    if (v < lo || v > kMaxInt)
      throw InvalidArgument(fmt::format("attention: {} = {} is out of range [{}, 2^31 - 1]", name, v, lo));
  };
  positive("batch", a.batch, 0);
  positive("heads_q", a.heads_q, 1);
  positive("heads_kv", a.heads_kv, 1);
  positive("seq_q", a.seq_q, 0);
  positive("seq_k", a.seq_k, 0);
  if (a.heads_q % a.heads_kv != 0)
    throw InvalidArgument(fmt::format("attention: heads_q = {} is not a multiple of heads_kv = {} (grouped-query "
                                      "attention shares each K/V head among heads_q / heads_kv query heads)",
                                      a.heads_q, a.heads_kv));
  if (!std::isfinite(a.scale) || a.scale < 0)
    throw InvalidArgument(fmt::format("attention: scale = {} must be finite and positive (0 means 1/sqrt(head_dim))",
                                      a.scale));
  if (a.scale == 0) a.scale = 1.0f / std::sqrt(float(d));
  if (a.last_round != LastRound::automatic && a.last_round != LastRound::whole && a.last_round != LastRound::split)
    throw InvalidArgument(fmt::format("attention: last_round = {} is not one of LastRound's automatic, whole, split",
                                      static_cast<int>(a.last_round)));
  a.q_strides = or_contiguous(a.q_strides, a.heads_q, a.seq_q, d);
  a.o_strides = or_contiguous(a.o_strides, a.heads_q, a.seq_q, d);
  a.k_strides = or_contiguous(a.k_strides, a.heads_kv, a.seq_k, d);
  a.v_strides = or_contiguous(a.v_strides, a.heads_kv, a.seq_k, d);
  const TensorArg q{"q", a.q, a.q_strides, a.heads_q, a.seq_q}, k{"k", a.k, a.k_strides, a.heads_kv, a.seq_k},
      v{"v", a.v, a.v_strides, a.heads_kv, a.seq_k}, o{"o", a.o, a.o_strides, a.heads_q, a.seq_q};
  for (const TensorArg* t : {&q, &k, &v, &o}) check_tensor(*t, d);
  if (a.lse != nullptr && reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    throw InvalidArgument(fmt::format("attention: lse = {} is not 4-byte aligned", static_cast<void*>(a.lse)));

  if (a.batch > 0 && a.seq_q > 0) {
    // O is written while other CTAs still read K and V: they must not share memory. (O may alias Q:
    // every CTA reads its Q rows before it writes the same rows of O.)
    const auto out = byte_range(o, a.batch, d);
    for (const TensorArg* t : {&k, &v}) {
      if (a.seq_k == 0) break;
      const auto in_range = byte_range(*t, a.batch, d);
      if (out.first < in_range.second && in_range.first < out.second)
        throw InvalidArgument(fmt::format("attention: o overlaps {}: the output must not share memory with k or v",
                                          t->name));
    }
  }

  if (spec.sparsity == Sparsity::dense) {
    if (a.pattern != nullptr) check_pattern_fits_spec(spec, *a.pattern);  // refuses
    return a;
  }
  if (a.seq_k == 0 || a.seq_q == 0) {
    if (a.seq_q == 0 || a.batch == 0) return a;
    throw InvalidArgument(fmt::format("attention: seq_k = 0 with the block-sparse spec '{}': a pattern needs at least "
                                      "one key block (use a dense spec for empty key sets)", key(spec)));
  }
  if (spec.sparsity == Sparsity::baked) {
    if (a.pattern != nullptr && !(*a.pattern == *baked))
      throw InvalidArgument(fmt::format("attention: the pattern given (digest {:016x}) is not the one baked into the "
                                        "kernel ({:016x})", a.pattern->digest(), baked->digest()));
    a.pattern = baked;
  }
  if (a.pattern == nullptr)
    throw InvalidArgument(fmt::format("attention: the block-sparse spec '{}' needs args.pattern", key(spec)));
  check_pattern(spec, *a.pattern, a.heads_q, a.seq_q, a.seq_k);
  return a;
}

}  // namespace sjit::attention

namespace sjit::attention {

AttentionBackwardArgs checked_backward_args(const AttentionSpec& spec, const AttentionBackwardArgs& in,
                                            const BlockPattern* baked) {
  // The shape, scale and pattern rules are the forward's: check them through a forward view.
  AttentionForwardArgs f;
  f.q = in.q, f.k = in.k, f.v = in.v, f.o = in.dq, f.lse = nullptr;
  f.batch = in.batch, f.heads_q = in.heads_q, f.heads_kv = in.heads_kv, f.seq_q = in.seq_q, f.seq_k = in.seq_k;
  f.q_strides = in.q_strides, f.k_strides = in.k_strides, f.v_strides = in.v_strides, f.o_strides = in.dq_strides;
  f.scale = in.scale, f.pattern = in.pattern;
  const AttentionForwardArgs checked = checked_forward_args(spec, f, baked);
  AttentionBackwardArgs a = in;
  a.scale = checked.scale, a.pattern = checked.pattern;
  a.q_strides = checked.q_strides, a.k_strides = checked.k_strides, a.v_strides = checked.v_strides;
  a.dq_strides = checked.o_strides;
  const int d = spec.head_dim;
  a.o_strides = or_contiguous(a.o_strides, a.heads_q, a.seq_q, d);
  a.do_strides = or_contiguous(a.do_strides, a.heads_q, a.seq_q, d);
  a.dk_strides = or_contiguous(a.dk_strides, a.heads_kv, a.seq_k, d);
  a.dv_strides = or_contiguous(a.dv_strides, a.heads_kv, a.seq_k, d);
  const TensorArg o{"o", a.o, a.o_strides, a.heads_q, a.seq_q}, d_o{"d_o", a.d_o, a.do_strides, a.heads_q, a.seq_q},
      dk{"dk", a.dk, a.dk_strides, a.heads_kv, a.seq_k}, dv{"dv", a.dv, a.dv_strides, a.heads_kv, a.seq_k},
      q{"q", a.q, a.q_strides, a.heads_q, a.seq_q}, k{"k", a.k, a.k_strides, a.heads_kv, a.seq_k},
      v{"v", a.v, a.v_strides, a.heads_kv, a.seq_k}, dq{"dq", a.dq, a.dq_strides, a.heads_q, a.seq_q};
  for (const TensorArg* t : {&o, &d_o, &dk, &dv}) check_tensor(*t, d);
  if (a.query_tile_cols != 0 && a.query_tile_cols != 64 && a.query_tile_cols != 128)
    throw InvalidArgument(fmt::format("attention backward: query_tile_cols = {}: use 64 or 128 (0 leaves them to "
                                      "be chosen)", a.query_tile_cols));
  if (a.walk && *a.walk != BackwardWalk::tiles && *a.walk != BackwardWalk::packed && *a.walk != BackwardWalk::gathered)
    throw InvalidArgument(fmt::format("attention backward: walk = {}: not a BackwardWalk (tiles, packed or gathered)",
                                      int(*a.walk)));
  if (a.lse == nullptr) throw InvalidArgument("attention backward: lse is null: pass the forward's log-sum-exp");
  if (reinterpret_cast<std::uintptr_t>(a.lse) % 4 != 0)
    throw InvalidArgument(fmt::format("attention backward: lse = {} is not 4-byte aligned", static_cast<const void*>(a.lse)));
  if (a.heads_q / a.heads_kv > 64)
    throw InvalidArgument(fmt::format("attention backward: {} query heads per K/V head: at most 64 are supported",
                                      a.heads_q / a.heads_kv));
  if (spec.sparsity != Sparsity::dense && a.batch > 0 && (a.seq_q == 0 || a.seq_k == 0))
    throw InvalidArgument(fmt::format("attention backward: seq_q = {}, seq_k = {} with the block-sparse spec '{}': a "
                                      "pattern needs at least one block each way", a.seq_q, a.seq_k, key(spec)));
  if (a.batch == 0) return a;
  const TensorArg* outputs[] = {&dq, &dk, &dv};
  const TensorArg* all[] = {&q, &k, &v, &o, &d_o, &dq, &dk, &dv};
  for (const TensorArg* out : outputs) {
    if (out->seq == 0) continue;
    const auto range = byte_range(*out, a.batch, d);
    for (const TensorArg* other : all) {
      if (other == out || other->seq == 0) continue;
      const auto r = byte_range(*other, a.batch, d);
      if (range.first < r.second && r.first < range.second)
        throw InvalidArgument(fmt::format("attention backward: {} overlaps {}: gradients need memory of their own",
                                          out->name, other->name));
    }
  }
  return a;
}

}  // namespace sjit::attention
