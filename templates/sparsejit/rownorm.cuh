// Row normalizers of the entmax family over a [rows, n] matrix with a row stride:
// softmax, sparsemax, 1.5-entmax and alpha-entmax, forward and backward.
//
// A generated unit defines the config and names the kernel it wants, e.g.
//   struct Cfg { using T = __nv_bfloat16; static constexpr int kind = 2; static constexpr float alpha = 1.5f;
//                static constexpr int n = 64, threads_per_row = 8, vec = 8, block_threads = 256;
//                static constexpr bool row_in_smem = false, wrong_result_for_tests = false; };
//   name expression: sjit_kernels::rownorm_forward<Cfg>
// Each row is owned by a team of threads_per_row threads (see team.cuh and row_slice.cuh); a block
// holds block_threads / threads_per_row teams and walks the rows in a grid-stride loop.
#pragma once

#include "sparsejit/element.cuh"
#include "sparsejit/entmax_threshold.cuh"
#include "sparsejit/row_slice.cuh"
#include "sparsejit/team.cuh"

namespace sjit_kernels {

template <class Cfg>
struct RowNormTraits {
  using T = typename Cfg::T;
  static constexpr int n = Cfg::n;
  static constexpr int kind = Cfg::kind;
  static constexpr int tpr = Cfg::threads_per_row;
  static constexpr int rows_per_block = Cfg::block_threads / tpr;
  static constexpr bool is_15 = kind == kEntmax && Cfg::alpha == 1.5f;
  static constexpr int p_twice = kind == kEntmax ? twice_power(Cfg::alpha) : 0;
  using TeamT = Team<tpr, Cfg::block_threads>;
  using Slice = RowSlice<T, n, tpr, Cfg::vec, Cfg::row_in_smem>;

  static_assert(n >= 1, "rows have at least one element");
  static_assert(n % Cfg::vec == 0, "a packet never straddles the end of a row");
  static_assert(Cfg::vec * sizeof(T) <= 16, "packets are at most 16 bytes");
  static_assert(Cfg::block_threads % 32 == 0 && Cfg::block_threads <= 1024, "whole warps, at most 1024 threads");
  static_assert(!Cfg::row_in_smem || tpr == Cfg::block_threads, "a row in shared memory has the block to itself");
  static_assert(kind != kEntmax || Cfg::alpha > 1.0f, "entmax needs alpha > 1");

  // Test-only: the tuner's tests need a layout whose output is wrong (by 1%) to see it refused.
  static constexpr bool wrong_result = Cfg::wrong_result_for_tests;
};

// Normalizes one row in place: z (raw scores) becomes y. Returns the support size (0 for NaN rows).
// Every thread of a warp runs every reduction here, whatever its row holds: rows that need special
// handling are replaced by a benign row for the search and patched at the end.
template <class Cfg>
__device__ int normalize_row(typename RowNormTraits<Cfg>::Slice& z, float inv_temperature, bool want_support,
                             float* scratch, int& turn) {
  using Tr = RowNormTraits<Cfg>;
  using TeamT = typename Tr::TeamT;

  // 1. Row maximum, NaN and +inf census.
  struct Census {
    float max, nan, pos_inf, unused;
    __device__ static Census combine(Census a, Census b) {
      return {fmaxf(a.max, b.max), fmaxf(a.nan, b.nan), a.pos_inf + b.pos_inf, 0.0f};
    }
    __device__ static Census identity() { return {-infinity(), 0.0f, 0.0f, 0.0f}; }
  };
  Census c{-infinity(), 0.0f, 0.0f, 0.0f};
  z.for_each([&](float& v) {
    c.max = fmaxf(c.max, v);  // fmaxf ignores NaN, hence the separate flag
    if (v != v) c.nan = 1.0f;
    if (v == infinity()) c.pos_inf += 1.0f;
  });
  c = TeamT::reduce(c, scratch, turn);

  // 2. Scaled, max-subtracted scores x <= 0 with max x = 0. Subtracting first means no overflow.
  //    +inf entries share the mass (the limit of the definition): map them to 0 and the rest to -inf.
  //    NaN rows and rows of only -inf are undefined: search a harmless row and write NaN at the end.
  const bool undefined = c.nan != 0.0f || c.max == -infinity();
  const bool has_pos_inf = c.pos_inf > 0.0f;
  constexpr float log2e = 1.4426950408889634f;
  const float scale = (Tr::kind == kSoftmax ? log2e : Tr::kind == kSparsemax ? 1.0f : Cfg::alpha - 1.0f) * inv_temperature;
  z.for_each([&](float& v) {
    if (undefined) v = 0.0f;
    else if (has_pos_inf) v = v == infinity() ? 0.0f : -infinity();
    else v = (v - c.max) * scale;
  });

  // 3. The distribution itself.
  if constexpr (Tr::kind == kSoftmax) {
    Sum2 total{0.0f, 0.0f};
    z.for_each([&](float& v) { v = exp2f(v); total.a += v; });
    total = TeamT::reduce(total, scratch, turn);
    const float inv_total = 1.0f / total.a;
    z.for_each([&](float& v) { v *= inv_total; });
  } else {
    float tau;
    if constexpr (Tr::kind == kSparsemax) tau = sparsemax_threshold<TeamT>(z, scratch, turn);
    else if constexpr (Tr::is_15) tau = entmax15_threshold<TeamT>(z, scratch, turn);
    else tau = entmax_threshold_general<TeamT, typename Tr::Slice, Tr::p_twice>(z, Cfg::alpha, Cfg::n, scratch, turn);
    z.for_each([&](float& v) { v = entmax_value<Tr::kind, Tr::p_twice>(v, tau, Cfg::alpha); });
  }

  if (undefined) z.for_each([&](float& v) { v = quiet_nan(); });
  if constexpr (Tr::wrong_result) z.for_each([&](float& v) { v *= 1.01f; });

  int support = 0;
  if (want_support) {  // a kernel argument: uniform, so every lane takes the same branch
    Sum2 count{0.0f, 0.0f};
    z.for_each([&](float& v) { count.a += v > 0.0f ? 1.0f : 0.0f; });
    support = int(TeamT::reduce(count, scratch, turn).a);
  }
  return support;
}

// The row loop both kernels share. Each team takes one row per round; the loop bound is the same for
// the whole block, so warps never split across rounds. Teams past the last row still take part (their
// reductions keep warps whole) with active = false: they read nothing and store nothing.
// body(row, active, lane, scratch, turn).
template <class Cfg, class Body>
__device__ __forceinline__ void for_each_team_row(long long rows, Body body) {
  using Tr = RowNormTraits<Cfg>;
  __shared__ float scratch[Tr::TeamT::kScratchFloats];
  int turn = 0;
  const int team = threadIdx.x / Tr::tpr;
  const int lane = threadIdx.x % Tr::tpr;
  for (long long first = (long long)blockIdx.x * Tr::rows_per_block; first < rows;
       first += (long long)gridDim.x * Tr::rows_per_block) {
    const long long row = first + team;
    body(row < rows ? row : 0, row < rows, lane, scratch, turn);
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::block_threads)
rownorm_forward(const typename Cfg::T* __restrict__ x, typename Cfg::T* __restrict__ y, int* __restrict__ support,
                long long rows, long long ld_x, long long ld_y, float inv_temperature) {
  extern __shared__ float row_smem[];  // n floats when Cfg::row_in_smem, else unused
  for_each_team_row<Cfg>(rows, [&](long long row, bool active, int lane, float* scratch, int& turn) {
    typename RowNormTraits<Cfg>::Slice z(row_smem, lane);
    z.load(x + row * ld_x, active, -infinity());
    const int support_size = normalize_row<Cfg>(z, inv_temperature, support != nullptr, scratch, turn);
    if (active) {
      z.store(y + row * ld_y);
      if (support != nullptr && lane == 0) support[row] = support_size;
    }
  });
}

// dx = J^T dy with J = diag(s) - s s^T / sum(s), s_i = y_i^(2 - alpha) on the support
// (Peters, Niculae & Martins 2019, Prop. 2; softmax s = y, sparsemax s = 1 on the support),
// then divided by the temperature. Only the support contributes: s is 0 elsewhere.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::block_threads)
rownorm_backward(const typename Cfg::T* __restrict__ y, const typename Cfg::T* __restrict__ dy,
                 typename Cfg::T* __restrict__ dx, long long rows, long long ld_y, long long ld_dy,
                 long long ld_dx, float inv_temperature) {
  using Tr = RowNormTraits<Cfg>;
  extern __shared__ float row_smem[];  // 2 n floats when Cfg::row_in_smem
  for_each_team_row<Cfg>(rows, [&](long long row, bool active, int lane, float* scratch, int& turn) {
    typename Tr::Slice yv(row_smem, lane), g(row_smem + Cfg::n, lane);
    yv.load(y + row * ld_y, active, 0.0f);
    g.load(dy + row * ld_dy, active, 0.0f);

    Sum2 sums{0.0f, 0.0f};  // a: sum s, b: <s, dy>
    yv.for_each_with(g, [&](float& yi, float& gi) {
      float s;
      if constexpr (Tr::kind == kSoftmax) s = yi;
      else if constexpr (Tr::kind == kSparsemax) s = yi > 0.0f ? 1.0f : 0.0f;
      else if constexpr (Tr::is_15) s = sqrtf(fmaxf(yi, 0.0f));
      else s = yi > 0.0f ? exp2f((2.0f - Cfg::alpha) * __log2f(yi)) : 0.0f;
      if (yi != yi) s = yi;  // NaN in y propagates
      yi = s;                // the slice now holds s
      sums.a += s;
      sums.b += s * gi;
    });
    sums = Tr::TeamT::reduce(sums, scratch, turn);
    const float q = sums.b / sums.a;
    yv.for_each_with(g, [&](float& s, float& gi) { gi = s * (gi - q) * inv_temperature; });
    if constexpr (Tr::wrong_result) g.for_each([&](float& v) { v *= 1.01f; });
    if (active) g.store(dx + row * ld_dx);
  });
}

}  // namespace sjit_kernels
