// The threshold tau of sparsemax and alpha-entmax for one row held by a team.
//
// Input: scaled scores x_i = (alpha - 1)(z_i - max z) / T, so max x = 0 and tau lies in
// [-1, -(1/n)^(alpha-1)]. Output: tau with sum_i [x_i - tau]_+^(1/(alpha-1)) = 1
// (Peters, Niculae & Martins 2019, eq. 4; alpha = 2 is sparsemax, Martins & Astudillo 2016).
//
// Method, sort-free: f(tau) = sum_i [x_i - tau]_+^p - 1 (p = 1/(alpha-1)) is decreasing, and convex
// for alpha <= 2, so Newton's method started left of the root (tau = -1, where f >= 0) climbs to it
// without overshooting. Each step also tests the current support guess S = {x > tau} in closed form:
//   sparsemax: r = tau + (sum_S (x - tau) - 1) / |S|
//   alpha 1.5: r = tau + d, d the smaller root of |S| d^2 - 2 s1 d + (s2 - 1) = 0
// If r <= min_S x, every member of S stays positive at r and everything else is already <= tau <= r,
// so f(r) = 0 exactly: r is the threshold itself, not an approximation (the sum is 1 by construction,
// never by renormalizing). For sparsemax the Newton step *is* r (Michelot's algorithm), so the loop
// ends after at most n steps and in practice a handful. Other alphas use Newton safeguarded by a
// bracket (see entmax_threshold_general) and stop at float resolution.
#pragma once

#include "sparsejit/team.cuh"

namespace sjit_kernels {

enum NormKindId { kSoftmax = 0, kSparsemax = 1, kEntmax = 2 };

// Loop bound for pathological inputs; tests see 2-10 steps on random rows.
inline constexpr int kMaxThresholdSteps = 100;  // inline: an internal-linkage constant gets a per-compile random symbol, making CUBINs differ

template <class TeamT, class Slice>
__device__ float sparsemax_threshold(Slice& x, float* scratch, int& turn) {
  float tau = -1.0f;
  bool done = false;
  for (int step = 0; TeamT::any(!done); ++step) {
    SupportStats st{0.0f, 0.0f, 0.0f, infinity()};
    x.for_each([&](float& v) {
      if (v > tau) { st.count += 1.0f; st.s1 += v - tau; st.min_x = fminf(st.min_x, v); }
    });
    st = TeamT::reduce(st, scratch, turn);
    if (done) continue;
    const float r = tau + (st.s1 - 1.0f) / st.count;
    // A consistent support gives the exact threshold, computed accurately once the mass at tau is
    // near 1 (far from the root, s1 - 1 cancels: then r is only the next, much closer, point).
    if (r <= st.min_x && st.s1 <= 2.0f) { tau = r; done = true; }
    else if (r <= tau || step >= kMaxThresholdSteps) done = true;  // float resolution reached
    else tau = r;
  }
  return tau;
}

template <class TeamT, class Slice>
__device__ float entmax15_threshold(Slice& x, float* scratch, int& turn) {
  float tau = -1.0f;
  bool done = false;
  for (int step = 0; TeamT::any(!done); ++step) {
    SupportStats st{0.0f, 0.0f, 0.0f, infinity()};
    x.for_each([&](float& v) {
      if (v > tau) {
        const float d = v - tau;
        st.count += 1.0f; st.s1 += d; st.s2 += d * d; st.min_x = fminf(st.min_x, v);
      }
    });
    st = TeamT::reduce(st, scratch, turn);
    if (done) continue;
    // Closed form on S, written as (s2 - 1) / (s1 + sqrt(disc)) to avoid cancellation.
    const float disc = st.s1 * st.s1 - st.count * (st.s2 - 1.0f);
    // Newton on ||[x - tau]_+||_2 - 1 (see entmax_threshold_general): fewer steps than on f itself.
    const float norm = sqrtf(st.s2);
    float next = tau + (norm - 1.0f) * st.s2 / (norm * st.s1);
    if (disc >= 0.0f) {
      const float r = tau + (st.s2 - 1.0f) / (st.s1 + sqrtf(disc));
      if (r <= st.min_x) {
        // Exact on a consistent support; accurate once the mass s2 at tau is near 1 (else disc
        // cancels), so far from the root r only becomes the next point.
        if (st.s2 <= 2.0f) { tau = r; done = true; continue; }
        next = r;
      }
    }
    if (next <= tau || step >= kMaxThresholdSteps) done = true;
    else tau = next;
  }
  return tau;
}

// d^p and d^(p-1) for d > 0, with the exponent known at compile time: repeated products when p is a
// whole or half-whole number (alpha = 1.25 gives p = 4), the multifunction unit otherwise.
template <int P_TWICE>  // 2p when that is a whole number <= 16, else 0
struct Power {
  __device__ __forceinline__ static void eval(float d, float p, float& dp, float& dp_minus_1) {
    if constexpr (P_TWICE == 1) {         // p = 1/2 (alpha = 3)
      dp = sqrtf(d);
      dp_minus_1 = rsqrtf(d);
    } else if constexpr (P_TWICE > 1) {   // p = m or m + 1/2, m >= 1
      float lower = 1.0f;                 // d^(m-1)
#pragma unroll
      for (int i = 0; i < P_TWICE / 2 - 1; ++i) lower *= d;
      dp_minus_1 = P_TWICE % 2 ? lower * sqrtf(d) : lower;
      dp = dp_minus_1 * d;
    } else {  // two multifunction-unit ops per element: that unit is this path's bottleneck
      dp_minus_1 = exp2f((p - 1.0f) * __log2f(d));
      dp = dp_minus_1 * d;
    }
  }
};

// Any alpha > 1. Newton on F(tau) = ||[x - tau]_+||_p - 1 rather than on f: the p-norm is convex in
// tau for p >= 1 and nearly straight (exactly straight on a fixed support of equal entries), so
// Newton from the left takes a few steps where Newton on f takes many. A bisection bracket keeps
// every step inside [lo, hi] (for alpha > 2, p < 1 and F is not convex).
template <class TeamT, class Slice, int P_TWICE>
__device__ float entmax_threshold_general(Slice& x, float alpha, int n, float* scratch, int& turn) {
  const float p = 1.0f / (alpha - 1.0f);
  float lo = -1.0f;                                           // f(lo) >= 1: the max alone gives 1
  float hi = -exp2f(-(alpha - 1.0f) * log2f(float(n)));       // f(hi) <= 1: (1/n)^(alpha-1) each
  float tau = lo;
  bool done = false;
  for (int step = 0; TeamT::any(!done); ++step) {
    SupportStats st{0.0f, 0.0f, 0.0f, infinity()};
    x.for_each([&](float& v) {
      if (v > tau) {
        float dp, dp1;
        Power<P_TWICE>::eval(v - tau, p, dp, dp1);
        st.count += 1.0f; st.s1 += dp; st.s2 += dp1;
      }
    });
    st = TeamT::reduce(st, scratch, turn);
    if (done) continue;
    if (st.s1 == 1.0f) { done = true; continue; }
    if (st.s1 > 1.0f) lo = tau; else hi = tau;
    const float norm = exp2f(log2f(st.s1) / p);               // ||[x - tau]_+||_p = F + 1
    float next = tau + (norm - 1.0f) * st.s1 / (norm * st.s2);  // F' = -norm s2 / s1
    // Converged first: a step that rounds to nothing must not fall back to bisection, which would
    // jump far from the root (and make the warp wait for this row).
    if (fabsf(next - tau) <= 1e-6f * fabsf(tau) || step >= kMaxThresholdSteps) done = true;
    else if (!(next > lo && next < hi)) next = 0.5f * (lo + hi);
    tau = next;
  }
  return tau;
}

// y = [x - tau]_+^p with the exponent known at compile time where it has a cheap form.
template <int KIND, int P_TWICE>
__device__ __forceinline__ float entmax_value(float x, float tau, float alpha) {
  const float d = fmaxf(x - tau, 0.0f);
  if constexpr (KIND == kSparsemax) return d;
  if (d <= 0.0f) return 0.0f;
  float dp, unused;
  Power<P_TWICE>::eval(d, 1.0f / (alpha - 1.0f), dp, unused);
  return dp;
}

// 2p = 2 / (alpha - 1) when it is a whole number up to 16 (alpha = 1.5: 4, alpha = 1.25: 8), else 0.
__host__ __device__ constexpr int twice_power(float alpha) {
  const float two_p = 2.0f / (alpha - 1.0f);
  const int whole = int(two_p + 0.5f);
  return whole >= 1 && whole <= 16 && two_p == float(whole) ? whole : 0;
}

}  // namespace sjit_kernels
