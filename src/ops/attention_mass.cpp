// attention_block_mass: the softmax mass of every tile of blocks, measured with the attention kernels
// themselves. dV = P^T dO, so a dO whose row i is the one-hot of column r - first (r: the query block
// of row i, first: the first block of this chunk) gives dV[j][r - first] = sum over block r's rows of
// P[i][j], the probabilities key j takes from that query block; summing dV's rows over a key block gives
// the tile's mass. head_dim query blocks a backward, one query head of each K/V group at a time (the
// backward sums dV over a group's heads).
#include "sparsejit/attention_mass.h"

#include <fmt/format.h>

#include <algorithm>

#include "sparsejit/device.h"
#include "sparsejit/dtype.h"
#include "sparsejit/error.h"
#include "sparsejit/pattern.h"

namespace sjit {

std::vector<float> attention_block_mass(const AttentionSpec& spec, const AttentionForwardArgs& args, int block_size,
                                        Stream stream) {
  constexpr std::string_view context = "attention_block_mass";
  if (!BlockPattern::is_supported_block_size(block_size))
    throw InvalidArgument(fmt::format("{}: block_size = {}: use 16, 32, 64 or 128", context, block_size));
  if (spec.sparsity != Sparsity::dense)
    throw InvalidArgument(fmt::format("{}: spec '{}' is not dense: the mass is that of the dense attention (causal "
                                      "or not) that a pattern would then leave out; give a spec with sparsity=dense",
                                      context, key(spec)));
  if (args.heads_kv < 1 || args.heads_q < 1 || args.heads_q % args.heads_kv != 0)
    throw InvalidArgument(fmt::format("{}: heads_q = {} must be a positive multiple of heads_kv = {}", context,
                                      args.heads_q, args.heads_kv));
  const std::int64_t b = args.batch, hkv = args.heads_kv, sq = args.seq_q, sk = args.seq_k, d = spec.head_dim;
  const std::int64_t group = args.heads_q / hkv;
  if (b < 1 || sq < 1 || sk < 1)
    throw InvalidArgument(fmt::format("{}: batch = {}, seq_q = {}, seq_k = {}: each must be at least 1", context, b,
                                      sq, sk));
  const std::int64_t rows = (sq + block_size - 1) / block_size, cols = (sk + block_size - 1) / block_size;
  const std::size_t element = size_of(spec.dtype);

  // One query head of each group a call: the heads g, g + group, ... of q, as a tensor of hkv heads.
  const Strides q_strides = args.q_strides.head != 0 ? args.q_strides : Strides::bhsd(args.heads_q, sq, d);
  const Strides kv_strides = args.k_strides.head != 0 ? args.k_strides : Strides::bhsd(hkv, sk, d);
  AttentionSpec dense = spec;
  dense.pass = Pass::forward;
  Attention attention(dense);
  const std::size_t q_elements = std::size_t(b * hkv * sq * d), kv_elements = std::size_t(b * hkv * sk * d);
  DeviceBuffer o(q_elements * element), lse(std::size_t(b * hkv * sq) * 4), d_o(q_elements * element),
      dq(q_elements * element), dk(kv_elements * element), dv(kv_elements * element);
  AttentionForwardArgs f;
  f.k = args.k, f.v = args.k;  // (dV does not depend on V: any tensor of its shape will do)
  f.o = o.data(), f.lse = lse.as<float>();
  f.batch = b, f.heads_q = hkv, f.heads_kv = hkv, f.seq_q = sq, f.seq_k = sk;
  f.q_strides = {q_strides.batch, q_strides.head * group, q_strides.row};
  f.k_strides = f.v_strides = kv_strides;
  f.scale = args.scale;
  AttentionBackwardArgs bw;
  bw.k = f.k, bw.v = f.v, bw.o = o.data(), bw.lse = lse.as<float>(), bw.d_o = d_o.data();
  bw.dq = dq.data(), bw.dk = dk.data(), bw.dv = dv.data();
  bw.batch = b, bw.heads_q = hkv, bw.heads_kv = hkv, bw.seq_q = sq, bw.seq_k = sk;
  bw.q_strides = f.q_strides, bw.k_strides = bw.v_strides = kv_strides;
  bw.scale = args.scale;

  std::vector<double> mass(std::size_t(args.heads_q * rows * cols), 0.0);
  std::vector<float> one_hot(q_elements), got(kv_elements);
  std::vector<unsigned char> bytes(std::max(q_elements, kv_elements) * element);
  std::int64_t uploaded = -1;  // the chunk whose dO the device holds (the backward only reads it)
  for (std::int64_t g = 0; g < group; ++g) {
    f.q = bw.q = static_cast<const unsigned char*>(args.q) + std::size_t(g * q_strides.head) * element;
    attention.forward(f, stream);
    for (std::int64_t first = 0; first < rows; first += d) {
      if (first != uploaded) {
        // dO: row i of every (batch, head) the one-hot of its query block's column in this chunk.
        std::fill(one_hot.begin(), one_hot.end(), 0.0f);
        for (std::int64_t bh = 0; bh < b * hkv; ++bh)
          for (std::int64_t i = 0; i < sq; ++i) {
            const std::int64_t column = i / block_size - first;
            if (column >= 0 && column < d) one_hot[std::size_t((bh * sq + i) * d + column)] = 1.0f;
          }
        encode(spec.dtype, one_hot, bytes.data());
        synchronize(stream);  // (the last backward has read the last dO)
        d_o.upload(bytes.data(), q_elements * element);
        uploaded = first;
      }
      attention.backward(bw, stream);
      synchronize(stream);
      dv.download(bytes.data(), kv_elements * element);
      decode(spec.dtype, bytes.data(), got);
      for (std::int64_t bh = 0; bh < b * hkv; ++bh) {
        const std::int64_t head_q = bh % hkv * group + g;
        for (std::int64_t j = 0; j < sk; ++j) {
          const float* row = got.data() + std::size_t((bh * sk + j) * d);
          double* tiles = mass.data() + std::size_t((head_q * rows + first) * cols + j / block_size);
          for (std::int64_t r = 0; r < std::min(d, rows - first); ++r) tiles[r * cols] += row[r];
        }
      }
    }
  }
  return std::vector<float>(mass.begin(), mass.end());
}

}  // namespace sjit
