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
// bisection bracket (f is concave for alpha > 2) and stop at float resolution.
#pragma once

#include "sparsejit/team.cuh"

namespace sjit_kernels {

enum NormKindId { kSoftmax = 0, kSparsemax = 1, kEntmax = 2 };

// Loop bound for pathological inputs; tests see 2-10 steps on random rows.
constexpr int kMaxThresholdSteps = 100;

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
    if (r <= st.min_x) { tau = r; done = true; }          // consistent support: exact threshold
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
    if (disc >= 0.0f) {
      const float r = tau + (st.s2 - 1.0f) / (st.s1 + sqrtf(disc));
      if (r <= st.min_x) { tau = r; done = true; continue; }
    }
    const float next = tau + (st.s2 - 1.0f) / (2.0f * st.s1);  // Newton: f = s2 - 1, f' = -2 s1
    if (next <= tau || step >= kMaxThresholdSteps) done = true;
    else tau = next;
  }
  return tau;
}

// Any alpha > 1: Newton on f with f' = -p sum_S (x - tau)^(p-1), kept inside a bisection bracket.
template <class TeamT, class Slice>
__device__ float entmax_threshold_general(Slice& x, float alpha, int n, float* scratch, int& turn) {
  const float p = 1.0f / (alpha - 1.0f);
  float lo = -1.0f;                                           // f(lo) >= 0: the max alone gives 1
  float hi = -exp2f(-(alpha - 1.0f) * log2f(float(n)));       // f(hi) <= 0: (1/n)^(alpha-1) each
  float tau = lo;
  bool done = false;
  for (int step = 0; TeamT::any(!done); ++step) {
    SupportStats st{0.0f, 0.0f, 0.0f, infinity()};
    x.for_each([&](float& v) {
      if (v > tau) {
        const float d = v - tau;
        const float w = exp2f(p * log2f(d));  // d^p
        st.count += 1.0f; st.s1 += w; st.s2 += w / d;
      }
    });
    st = TeamT::reduce(st, scratch, turn);
    if (done) continue;
    const float f = st.s1 - 1.0f;
    if (f == 0.0f) { done = true; continue; }
    if (f > 0.0f) lo = tau; else hi = tau;
    float next = tau + f / (p * st.s2);
    if (!(next > lo && next < hi)) next = 0.5f * (lo + hi);
    if (fabsf(next - tau) <= 1e-7f * fabsf(tau) || step >= kMaxThresholdSteps) done = true;
    tau = next;
  }
  return tau;
}

// y = [x - tau]_+^p with the exponent known at compile time where it has a cheap form.
template <int KIND>
__device__ __forceinline__ float entmax_value(float x, float tau, float alpha, bool is_15) {
  const float d = fmaxf(x - tau, 0.0f);
  if constexpr (KIND == kSparsemax) return d;
  else if (is_15) return d * d;
  else return d > 0.0f ? exp2f(log2f(d) / (alpha - 1.0f)) : 0.0f;
}

}  // namespace sjit_kernels
