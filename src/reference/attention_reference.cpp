// Float64 CPU reference for softmax attention, forward and backward (see attention_reference.h).
//
// Both passes walk one query row at a time: row_probabilities() builds that row's P_i over every key
// (0 where the key is not allowed) and its lse, exactly the quantities a FlashAttention kernel holds
// for the row after its online softmax. The forward then takes o_i = P_i V; the backward recomputes P_i
// instead of storing the seq_q x seq_k matrix, as FlashAttention-2 does (Dao 2023, Algorithm 2).
//
// The same code runs in fp32 (R = float) for attention_reference_fp32.h: the GPU tests check the kernels
// against the reference run in fp32 as well.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "sparsejit/attention_reference.h"
#include "sparsejit/error.h"
#include "reference/arithmetic.h"
#include "reference/attention_reference_fp32.h"

namespace sjit::reference {
namespace {

template <class R>
constexpr R kInf = std::numeric_limits<R>::infinity();

void check_at_least(std::string_view field, std::int64_t value, std::int64_t minimum) {
  if (value < minimum) {
    throw InvalidArgument(fmt::format("attention reference: {} = {} is not allowed; it must be >= {}",
                                      field, value, minimum));
  }
}

void check_problem(const AttentionProblem& p) {
  check_at_least("batch", p.batch, 0);
  check_at_least("heads_q", p.heads_q, 1);
  check_at_least("heads_kv", p.heads_kv, 1);
  check_at_least("seq_q", p.seq_q, 0);
  check_at_least("seq_k", p.seq_k, 0);
  check_at_least("head_dim", p.head_dim, 1);
  if (p.heads_q % p.heads_kv != 0) {
    throw InvalidArgument(fmt::format(
        "attention reference: heads_q = {} is not a multiple of heads_kv = {}; grouped-query attention "
        "needs every kv head to serve the same number of query heads", p.heads_q, p.heads_kv));
  }
  if (!std::isfinite(p.scale)) {
    throw InvalidArgument(fmt::format(
        "attention reference: scale = {} is not allowed; it must be finite (0 means 1/sqrt(head_dim))", p.scale));
  }
}

// A tensor of layout [batch, heads, seq, head_dim] must hold exactly that many elements.
void check_span(std::string_view name, std::span<const double> tensor, std::string_view heads_field,
                std::int64_t heads, std::string_view seq_field, std::int64_t seq, const AttentionProblem& p) {
  const std::int64_t expected = p.batch * heads * seq * p.head_dim;
  if (static_cast<std::int64_t>(tensor.size()) != expected) {
    throw InvalidArgument(fmt::format(
        "attention reference: {} has {} elements but [batch, {}, {}, head_dim] = [{}, {}, {}, {}] needs {}",
        name, tensor.size(), heads_field, seq_field, p.batch, heads, seq, p.head_dim, expected));
  }
}

void check_inputs(const AttentionProblem& p, std::span<const double> q, std::span<const double> k,
                  std::span<const double> v) {
  check_problem(p);
  check_span("q", q, "heads_q", p.heads_q, "seq_q", p.seq_q, p);
  check_span("k", k, "heads_kv", p.heads_kv, "seq_k", p.seq_k, p);
  check_span("v", v, "heads_kv", p.heads_kv, "seq_k", p.seq_k, p);
}

double effective_scale(const AttentionProblem& p) {
  return p.scale != 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.head_dim));
}

template <class R>
R dot(const R* a, const R* b, std::int64_t n) {
  R sum = 0;
  for (std::int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Where one (batch, head) slice starts in a [batch, heads, seq, head_dim] tensor.
std::size_t slice_offset(const AttentionProblem& p, std::int64_t b, std::int64_t heads, std::int64_t h,
                         std::int64_t seq) {
  return static_cast<std::size_t>(((b * heads + h) * seq) * p.head_dim);
}

// One query row's softmax over the keys of its kv head: fills probs[j] = P_ij (0 where key j is not
// allowed) and returns lse_i, or -inf when no key is allowed (then probs is all 0).
// Max-subtraction: exp(s - max) lies in (0, 1] and the max term is exactly 1, so the sum is in
// [1, seq_k] and neither overflows nor underflows; lse = max + log(sum).
template <class R>
R row_probabilities(const AttentionProblem& p, R scale, std::int64_t head, std::int64_t i, const R* q_row,
                    const R* k_head, std::vector<R>& probs) {
  std::vector<bool> allowed(static_cast<std::size_t>(p.seq_k));
  R row_max = -kInf<R>;
  bool any_allowed = false;
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    probs[j] = 0;
    if (!attention_allows(p, head, i, j)) continue;
    allowed[j] = true;
    any_allowed = true;
    probs[j] = scale * dot(q_row, k_head + j * p.head_dim, p.head_dim);  // the score s_ij, for now
    if (probs[j] > row_max) row_max = probs[j];
  }
  if (!any_allowed) return -kInf<R>;

  R sum_exp = 0;
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    if (allowed[j]) sum_exp += std::exp(probs[j] - row_max);
  }
  const R lse = row_max + std::log(sum_exp);
  for (std::int64_t j = 0; j < p.seq_k; ++j) {
    probs[j] = allowed[j] ? std::exp(probs[j] - row_max) / sum_exp : R(0);
  }
  return lse;
}

// Calls visit(b, h, kv_head) for every (batch, query head) pair, kv_head the one GQA assigns to h.
template <class Visit>
void for_each_head(const AttentionProblem& p, Visit visit) {
  const std::int64_t group_size = p.heads_q / p.heads_kv;  // query heads per kv head
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads_q; ++h) visit(b, h, h / group_size);
  }
}

template <class R>
AttentionOutput forward_in(const AttentionProblem& p, std::span<const double> q_wide, std::span<const double> k_wide,
                           std::span<const double> v_wide) {
  check_inputs(p, q_wide, k_wide, v_wide);
  const ValuesIn<R> q(q_wide), k(k_wide), v(v_wide);
  const R scale = static_cast<R>(effective_scale(p));
  const std::int64_t dim = p.head_dim;
  std::vector<R> o(q.size(), R(0)), lse(static_cast<std::size_t>(p.batch * p.heads_q * p.seq_q), -kInf<R>);
  std::vector<R> probs(static_cast<std::size_t>(p.seq_k));

  for_each_head(p, [&](std::int64_t b, std::int64_t h, std::int64_t kv_head) {
    const R* q_head = q.data() + slice_offset(p, b, p.heads_q, h, p.seq_q);
    const R* k_head = k.data() + slice_offset(p, b, p.heads_kv, kv_head, p.seq_k);
    const R* v_head = v.data() + slice_offset(p, b, p.heads_kv, kv_head, p.seq_k);
    R* o_head = o.data() + slice_offset(p, b, p.heads_q, h, p.seq_q);
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      lse[(b * p.heads_q + h) * p.seq_q + i] = row_probabilities(p, scale, h, i, q_head + i * dim, k_head, probs);
      R* o_row = o_head + i * dim;
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        if (probs[j] == R(0)) continue;  // masked keys (and weights that underflowed) add nothing
        for (std::int64_t d = 0; d < dim; ++d) o_row[d] += probs[j] * v_head[j * dim + d];
      }
    }
  });
  return {widened(o), widened(lse)};
}

template <class R>
AttentionGradients backward_in(const AttentionProblem& p, std::span<const double> q_wide,
                               std::span<const double> k_wide, std::span<const double> v_wide,
                               std::span<const double> d_o_wide) {
  check_inputs(p, q_wide, k_wide, v_wide);
  check_span("d_o", d_o_wide, "heads_q", p.heads_q, "seq_q", p.seq_q, p);
  const ValuesIn<R> q(q_wide), k(k_wide), v(v_wide), d_o(d_o_wide);
  const R scale = static_cast<R>(effective_scale(p));
  const std::int64_t dim = p.head_dim;
  std::vector<R> dq(q.size(), R(0)), dk(k.size(), R(0)), dv(v.size(), R(0));
  std::vector<R> probs(static_cast<std::size_t>(p.seq_k));
  std::vector<R> o_row(static_cast<std::size_t>(dim));

  for_each_head(p, [&](std::int64_t b, std::int64_t h, std::int64_t kv_head) {
    const std::size_t q_offset = slice_offset(p, b, p.heads_q, h, p.seq_q);
    const std::size_t kv_offset = slice_offset(p, b, p.heads_kv, kv_head, p.seq_k);
    const R* k_head = k.data() + kv_offset;
    const R* v_head = v.data() + kv_offset;
    R* dk_head = dk.data() + kv_offset;  // shared by the query heads of the group: accumulate
    R* dv_head = dv.data() + kv_offset;
    for (std::int64_t i = 0; i < p.seq_q; ++i) {
      const R* q_row = q.data() + q_offset + i * dim;
      const R* do_row = d_o.data() + q_offset + i * dim;
      R* dq_row = dq.data() + q_offset + i * dim;
      if (row_probabilities(p, scale, h, i, q_row, k_head, probs) == -kInf<R>) continue;  // no key: P_i = 0

      // o_i again, for D_i = dO_i . o_i (FlashAttention-2's rowsum(dO * O)).
      std::fill(o_row.begin(), o_row.end(), R(0));
      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        if (probs[j] == R(0)) continue;  // as in the forward: masked keys add nothing
        for (std::int64_t d = 0; d < dim; ++d) o_row[d] += probs[j] * v_head[j * dim + d];
      }
      const R row_delta = dot(do_row, o_row.data(), dim);

      for (std::int64_t j = 0; j < p.seq_k; ++j) {
        if (probs[j] == R(0)) continue;  // dS_ij and P_ij dO_i are both 0
        const R dp = dot(do_row, v_head + j * dim, dim);
        const R ds = probs[j] * (dp - row_delta);
        for (std::int64_t d = 0; d < dim; ++d) {
          dq_row[d] += scale * ds * k_head[j * dim + d];
          dk_head[j * dim + d] += scale * ds * q_row[d];
          dv_head[j * dim + d] += probs[j] * do_row[d];
        }
      }
    }
  });
  return {widened(dq), widened(dk), widened(dv)};
}

}  // namespace

bool attention_allows(const AttentionProblem& p, std::int64_t head, std::int64_t i, std::int64_t j) {
  if (p.causal) {
    // Bottom-right alignment shifts the diagonal so that the last query row ends at the last key.
    const std::int64_t last_visible_key = p.causal_bottom_right ? i + p.seq_k - p.seq_q : i;
    if (j > last_visible_key) return false;
  }
  return !p.filter || p.filter(head, i, j);
}

AttentionOutput attention_forward(const AttentionProblem& p, std::span<const double> q, std::span<const double> k,
                                  std::span<const double> v) {
  return forward_in<double>(p, q, k, v);
}

AttentionGradients attention_backward(const AttentionProblem& p, std::span<const double> q, std::span<const double> k,
                                      std::span<const double> v, std::span<const double> d_o) {
  return backward_in<double>(p, q, k, v, d_o);
}

AttentionOutput attention_forward_fp32(const AttentionProblem& p, std::span<const double> q,
                                       std::span<const double> k, std::span<const double> v) {
  return forward_in<float>(p, q, k, v);
}

AttentionGradients attention_backward_fp32(const AttentionProblem& p, std::span<const double> q,
                                           std::span<const double> k, std::span<const double> v,
                                           std::span<const double> d_o) {
  return backward_in<float>(p, q, k, v, d_o);
}

}  // namespace sjit::reference
