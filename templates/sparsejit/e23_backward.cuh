// E23 backward through time (docs/e23.md "Backward through time" and "... on the GPU"): one persistent
// launch undoes every step for every batch row, from t = T-1 down to 0, then forms dW_h and dW_w.
//
// What the forward saved (E23ForwardParams::save_*): h_0 .. h_T and w_0 .. w_{T-1} in fp32, and the
// tape M_t every K steps. Nothing else: the read and write weights a_t, b_t and the tapes between
// checkpoints are recomputed here. Replaying the tape needs no product (w_t is saved), so it is work of
// the batch row's own CTA alone: no grid barrier, no weights.
//
// Work items are the forward's: a tape item per batch row, a product tile per 16 rows x 32 batch rows.
// The products are the transposed ones (g_h = W_h^T g_z, g_h' += W_w^T g_w); the prologue writes W^T
// into the workspace so the forward's tile code (e23_gemv.cuh) runs unchanged on it. A step t is one
// pass of tape items and one of tiles, in turn, with no grid barrier: as in the forward, each side waits
// on its batch group's counters for only what it reads (e23_grid_sync.cuh):
//
//   tape item (row b)  wait for g_z_{t+1} of the group; undo the read of step t + 1 (g_z_{t+1} -> g_M,
//                      the tape's part of g_{h_{t+1}}); undo the write of step t (g_M -> g_w_t, g_M_t,
//                      the write scores' part of g_{h_{t+1}}); **signal**; then replay a step of the
//                      next segment down, off the critical path
//   tile (16 rows)     in the shadow of the tape items: W_h^T g_z_{t+1} (the recurrence's part);
//                      then wait for the group's tape items: g_{h_{t+1}} = W_w^T g_w_t + dy_t + the
//                      three parts; g_z_t = g_{h_{t+1}} (1 - h_{t+1}^2) -> du_t; **signal**
//   after step 0       tape items: undo the read of step 0 -> dm0; tiles: W_h^T g_z_0;  -- barrier --
//                      dh0 = the two parts of g_{h_0};  dW_w = sum_t g_w_t h_{t+1}^T,
//                      dW_h = sum_t g_z_t h_t^T (each 64 x 64 output tile summed by one CTA in a fixed
//                      order: deterministic).
//
// The tapes of a segment (K steps from a checkpoint) are replayed into a K-entry buffer before it is
// undone; the segment below is replayed into the entries the undo has freed, one step a step after the
// tape item's signal (segment_entry), so only one replay step a segment lies on the critical path (the
// last segment, undone first, is replayed whole before the first step).
//
// Sparsity: the normalizer Jacobian J = diag(c) - c c^T / sum(c) is zero off the support, so undoing a
// read or a write touches only the slots with a_i > 0 (b_i > 0); only the replay's scores see every slot.
#pragma once

#include "sparsejit/e23_forward.cuh"

namespace sjit_kernels {

inline constexpr int kE23OuterTile = 64;  // dW tiles: 64 x 64 outputs (FMAs: 4 x 4 a thread; mma: 16 x 32 a warp)
inline constexpr int kE23OuterChunk = 32;  // rows (t, b) staged in shared memory at a time

template <class Cfg>
struct E23BackwardTraits {
  using Tr = E23Traits<Cfg>;
  static constexpr int D = Tr::D, N = Tr::N, slots_padded = Tr::slots_padded;
  // Tape items: three [D] vectors, six [N] arrays and 8 scalars (TapeItemSmem); dW tiles: two [32][64]
  // stages. With p.state_in_shared, the row's g_M and the tape being undone follow at shared_floats
  // (2 N D floats more; the front end asks for them).
  static constexpr int tape_floats = 3 * D + 6 * slots_padded + 8;
  static constexpr int outer_floats = 2 * kE23OuterChunk * kE23OuterTile;
  static constexpr int shared_floats = tape_floats > Tr::shared_floats
                                           ? (tape_floats > outer_floats ? tape_floats : outer_floats)
                                           : (Tr::shared_floats > outer_floats ? Tr::shared_floats : outer_floats);
};

// dst[v][0, D) = src[v][0, D) (fp32) for V vectors, the whole CTA, a thread's loads of all V issued
// before any of its stores: one vector's loop after another is a branch each, and the loads of the
// next would wait for the previous one's, one L2 round trip a vector.
template <class Cfg, int V>
__device__ __forceinline__ void load_vectors(float* const (&dst)[V], const float* const (&src)[V]) {
  for (int k = 4 * threadIdx.x; k < Cfg::dim; k += 4 * Cfg::threads) {
    float4 x[V];
#pragma unroll
    for (int v = 0; v < V; ++v) x[v] = load_state4(src[v] + k);
#pragma unroll
    for (int v = 0; v < V; ++v) *reinterpret_cast<float4*>(dst[v] + k) = x[v];
  }
}
template <class Cfg>
__device__ __forceinline__ void load_vector(float* dst, const float* src) {
  float* const dsts[1] = {dst};
  const float* const srcs[1] = {src};
  load_vectors<Cfg, 1>(dsts, srcs);
}

// c_i of the normalizer Jacobian for weight y_i: y_i^(2 - alpha) on the support, 0 off it (softmax
// c = y, sparsemax c = 1 on the support).
template <class Cfg>
__device__ __forceinline__ float jacobian_weight(float y) {
  if constexpr (Cfg::kind == kSoftmax) return y;
  else if constexpr (Cfg::kind == kSparsemax) return y > 0.f ? 1.f : 0.f;
  else if constexpr (Cfg::alpha == 1.5f) return sqrtf(fmaxf(y, 0.f));
  else return y > 0.f ? exp2f((2.f - Cfg::alpha) * __log2f(y)) : 0.f;
}

// g := J(y) g with J = diag(c) - c c^T / sum(c). One whole warp; y and g in shared memory.
template <class Cfg>
__device__ __forceinline__ void jacobian_product(const float* y, float* g) {
  constexpr int N = Cfg::n_slots;
  const int lane = threadIdx.x % 32;
  float sum_c = 0.f, sum_cg = 0.f;
  for (int i = lane; i < N; i += 32) {
    const float c = jacobian_weight<Cfg>(y[i]);
    sum_c += c;
    sum_cg += c * g[i];
  }
  sum_c = warp_sum(sum_c);
  sum_cg = warp_sum(sum_cg);
  const float mean = sum_c > 0.f ? sum_cg / sum_c : 0.f;
  for (int i = lane; i < N; i += 32) g[i] = jacobian_weight<Cfg>(y[i]) * (g[i] - mean);
  __syncwarp();
}

// out[i] = <rows_i, v> for the slots with weight[i] > 0, and 0 for the others; rows of D floats, v in
// shared memory. Warp j takes slots j, j + warps, ...
template <class Cfg>
__device__ __forceinline__ void slot_dots(const float* rows, const float* v, const float* weights, float* out) {
  constexpr int D = Cfg::dim, warps = Cfg::threads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < Cfg::n_slots; i += warps) {
    if (!(weights[i] > 0.f)) {  // warp-uniform
      if (lane == 0) out[i] = 0.f;
      continue;
    }
    float dot = 0.f;
    for (int k = 4 * lane; k < D; k += 128) {
      dot += dot4(load_state4(rows + i * D + k), *reinterpret_cast<const float4*>(v + k));
    }
    dot = warp_sum(dot);
    if (lane == 0) out[i] = dot;
  }
}

// The segment buffer (seg_m, seg_a, seg_b: K entries) holds the replayed tapes of one segment while it is
// undone, and the next segment down is replayed into the entries already undone (see e23_backward): step
// k of segment j sits at entry k for even j and at K - 1 - k for odd j, so that undoing one segment from
// its end frees entries in the order the replay of the one before it fills them.
__device__ __forceinline__ int segment_entry(const E23BackwardParams& p, int segment, int k) {
  return segment % 2 == 0 ? k : p.checkpoint_every - 1 - k;
}
__device__ __forceinline__ int entry_of_step(const E23BackwardParams& p, int t) {
  return segment_entry(p, t / p.checkpoint_every, t % p.checkpoint_every);
}

// The opt-in profile (E23BackwardParams::profile, E23BackwardMark): point `mark` of step t, or with
// t = steps a point of the launch itself (E23BackwardLaunchMark). Nothing when not profiling.
__device__ __forceinline__ void backward_mark(const E23BackwardParams& p, int t, int mark) {
  profile_store(p.profile, p.steps + 1, kE23BackwardMarks, t, mark);
}

// Replays step k of segment j for batch row b (t = j K + k): M_t from M_{t-1} (the checkpoint when k = 0)
// with the write of step t - 1, the read weights a_t = f(s M_t h_t) and the write weights
// b_t = f(s M_t h_{t+1}); stored at the step's entry. The write scores use the forward's arithmetic
// (score_slots, normalize_slots, blend4), so the write weights come out with the forward's bits; the
// forward forms its read scores from the write's ((1 - b) q + b s <w, h>), so the read weights here
// agree with it to rounding. Everything it needs is saved state or an entry this CTA wrote.
// With `also` set (shared memory, N x D), the replayed tape is stored there too.
template <class Cfg>
__device__ void replay_step(const E23BackwardParams& p, int b, int j, int k, float* smem, float* also = nullptr) {
  using Bt = E23BackwardTraits<Cfg>;
  constexpr int D = Bt::D, N = Bt::N, warps = Cfg::threads / 32;
  float* h_now = smem;            // h_t
  float* h_next = smem + D;       // h_{t+1}
  float* w_prev = smem + 2 * D;   // w_{t-1}
  float* read = smem + 3 * D;     // scores, then a_t
  float* write = read + Bt::slots_padded;          // scores, then b_t
  float* write_prev = write + Bt::slots_padded;    // b_{t-1}
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t = j * p.checkpoint_every + k;
  const long long bd = (long long)p.batch * D, bnd = bd * N;
  const long long row = (long long)b * N * D;
  const int entry = segment_entry(p, j, k), entry_prev = k > 0 ? segment_entry(p, j, k - 1) : 0;
  const float* from = k == 0 ? p.save_m + ((long long)j * p.batch + b) * N * D : p.seg_m + entry_prev * bnd + row;
  float* to = p.seg_m + entry * bnd + row;
  // A warp walks positions (its slot group i0, i0 + warps, ...: kSlots slots; a chunk of kCols float4
  // columns a lane of each) and loads a position's tape before any of its stores: `to` might alias `from`
  // as far as the compiler knows, so a load written after a store waits for it (the loop as first written
  // took one L2 round trip per float4 a lane). The first position (the only one at N <= 8 and D <= 512)
  // is loaded before the vectors below, so its latency overlaps theirs. Loading the next position before
  // storing the current one too cost 235-255 registers and spilled.
  constexpr int cols = (D + 127) / 128, kCols = cols < 4 ? cols : 4, kSlots = N > warps ? 2 : 1;
  constexpr int chunks = (cols + kCols - 1) / kCols;
  const int groups = warp < N ? (N - warp + kSlots * warps - 1) / (kSlots * warps) : 0;
  const int positions = groups * chunks;  // warp-uniform
  auto load_at = [&](int pos, float4 (&m)[kSlots][kCols]) {
    const int i0 = warp + (pos / chunks) * kSlots * warps, base = (pos % chunks) * 128 * kCols;
#pragma unroll
    for (int si = 0; si < kSlots; ++si)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int i = i0 + si * warps, d = base + 128 * c + 4 * lane;
        m[si][c] = i < N && d < D ? load_state4(from + i * D + d) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
  };
  float4 cur[kSlots][kCols];
  if (positions > 0) load_at(0, cur);
  // The vectors and b_{t-1} (a slot a thread: N <= threads) requested together (load_vectors).
  static_assert(N <= Cfg::threads, "one slot a thread");
  const float b_prev = k > 0 && threadIdx.x < N ? __ldcg(p.seg_b + (entry_prev * (long long)p.batch + b) * N + threadIdx.x) : 0.f;
  const float* h_src = p.save_h + t * bd + b * D;
  if (k > 0) {
    float* const dst[3] = {h_now, h_next, w_prev};
    const float* const src[3] = {h_src, h_src + bd, p.save_w + (t - 1) * bd + b * D};
    load_vectors<Cfg, 3>(dst, src);
  } else {
    float* const dst[2] = {h_now, h_next};
    const float* const src[2] = {h_src, h_src + bd};
    load_vectors<Cfg, 2>(dst, src);
  }
  if (k > 0 && threadIdx.x < N) write_prev[threadIdx.x] = b_prev;
  __syncthreads();
  float dot_read[kSlots] = {}, dot_write[kSlots] = {};  // each lane in ascending d, as before
  for (int pos = 0; pos < positions; ++pos) {
    if (pos > 0) load_at(pos, cur);
    const int i0 = warp + (pos / chunks) * kSlots * warps, base = (pos % chunks) * 128 * kCols;
#pragma unroll
    for (int si = 0; si < kSlots; ++si) {
      const int i = i0 + si * warps;
      if (i >= N) break;  // warp-uniform
      const float bi = k == 0 ? 0.0f : write_prev[i];
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const int d = base + 128 * c + 4 * lane;
        if (d >= D) break;
        float4 v = cur[si][c];
        if (bi > 0.0f) v = blend4(v, *reinterpret_cast<const float4*>(w_prev + d), bi);
        store_state4(to + i * D + d, v);
        if (also != nullptr) *reinterpret_cast<float4*>(also + i * D + d) = v;
        dot_read[si] += dot4(v, *reinterpret_cast<const float4*>(h_now + d));
        dot_write[si] += dot4(v, *reinterpret_cast<const float4*>(h_next + d));
      }
    }
    if (pos % chunks == chunks - 1) {  // the group's last chunk: its scores
#pragma unroll
      for (int si = 0; si < kSlots; ++si) {
        const int i = i0 + si * warps;
        const float dr = warp_sum(dot_read[si]), dw = warp_sum(dot_write[si]);
        if (lane == 0 && i < N) read[i] = Cfg::scale * dr, write[i] = Cfg::scale * dw;
        dot_read[si] = dot_write[si] = 0.f;
      }
    }
  }
  __syncthreads();
  if (warp == 0) normalize_slots<Cfg>(read);
  if (warp == warps - 1) normalize_slots<Cfg>(write);
  __syncthreads();
  for (int i = threadIdx.x; i < N; i += Cfg::threads) {
    __stcg(p.seg_a + (entry * (long long)p.batch + b) * N + i, read[i]);
    __stcg(p.seg_b + (entry * (long long)p.batch + b) * N + i, write[i]);
  }
  __syncthreads();  // shared memory is reused next
}

// Shared memory of a tape item (E23BackwardTraits::tape_floats): h_{t+1} (which both the read of step
// t + 1 and the write of step t saw), g_z_{t+1}, w_t; then per slot b_t, the dots x, p, q, a_{t+1}, the
// read gradient r; then scalars. replay_step uses the first 3 D + 3 S floats, so a (at 3 D + 3 S) survives
// a replay between its load and its use.
template <class Cfg>
struct TapeItemSmem {
  float *h, *gz, *w, *b, *x, *p, *a, *q, *r, *scalars;
  __device__ __forceinline__ explicit TapeItemSmem(float* smem) {
    constexpr int D = Cfg::dim, S = E23BackwardTraits<Cfg>::slots_padded;
    h = smem, gz = smem + D, w = smem + 2 * D;
    b = smem + 3 * D, x = b + S, p = x + S, a = p + S, q = a + S, r = q + S, scalars = r + S;
  }
};

// g_{M} of batch row b, carried down the steps, and the tape M_t of the step being undone: in the owning
// CTA's shared memory (after the kernel's own, E23BackwardTraits::shared_floats) when the launch keeps
// them there, else g_M in the workspace and the tape read where the replay stored it.
template <class Cfg, bool kShared>
__device__ __forceinline__ float* grad_tape_of(const E23BackwardParams& p, int b, float* smem) {
  if constexpr (kShared) return smem + E23BackwardTraits<Cfg>::shared_floats;
  else return p.g_m + (long long)b * Cfg::n_slots * Cfg::dim;
}
template <class Cfg>
__device__ __forceinline__ float* undone_tape_in_shared(float* smem) {
  return smem + E23BackwardTraits<Cfg>::shared_floats + Cfg::n_slots * Cfg::dim;
}

// dst[0, N D) = src (global, fp32) into shared memory without passing through registers (cp.async on
// sm_80+): the copy runs while the CTA does other work; wait_async_copies() before reading dst.
template <class Cfg>
__device__ __forceinline__ void copy_tape_async(float* dst, const float* src) {
  constexpr int floats = Cfg::n_slots * Cfg::dim;
  for (int e = 4 * threadIdx.x; e < floats; e += 4 * Cfg::threads) {
#if __CUDA_ARCH__ >= 800
    const unsigned to = unsigned(__cvta_generic_to_shared(dst + e));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(src + e) : "memory");
#else
    *reinterpret_cast<float4*>(dst + e) = load_state4(src + e);
#endif
  }
}
__device__ __forceinline__ void wait_async_copies() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}

// V consecutive floats of a column, V = 4 or 2: from shared memory (kShared) or through L2.
template <int V>
struct Cols {
  float v[V];
};
template <int V, bool kShared>
__device__ __forceinline__ Cols<V> load_cols(const float* at) {
  Cols<V> c;
  if constexpr (V == 4) {
    const float4 x = kShared ? *reinterpret_cast<const float4*>(at) : __ldcg(reinterpret_cast<const float4*>(at));
    c.v[0] = x.x, c.v[1] = x.y, c.v[2] = x.z, c.v[3] = x.w;
  } else {
    const float2 x = kShared ? *reinterpret_cast<const float2*>(at) : __ldcg(reinterpret_cast<const float2*>(at));
    c.v[0] = x.x, c.v[1] = x.y;
  }
  return c;
}
template <int V, bool kShared>
__device__ __forceinline__ void store_cols(float* at, const Cols<V>& c) {
  if constexpr (V == 4) {
    const float4 x = make_float4(c.v[0], c.v[1], c.v[2], c.v[3]);
    if constexpr (kShared) *reinterpret_cast<float4*>(at) = x;
    else __stcg(reinterpret_cast<float4*>(at), x);
  } else {
    const float2 x = make_float2(c.v[0], c.v[1]);
    if constexpr (kShared) *reinterpret_cast<float2*>(at) = x;
    else __stcg(reinterpret_cast<float2*>(at), x);
  }
}

// Before the wait for g_z_{t+1} (its latency and the tiles' products hide them), for the slots the write
// of step t touched (b_i > 0): p_i = <g_M_i, w - M_t,i> with g_M still lacking the read of step t + 1, and
// q_i = <h_{t+1}, w - M_t,i>. One warp a slot.
template <class Cfg, bool kShared>
__device__ __forceinline__ void write_dots_before_wait(const float* g_m, const float* tape, const TapeItemSmem<Cfg>& s) {
  constexpr int D = Cfg::dim, warps = Cfg::threads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < Cfg::n_slots; i += warps) {
    if (!(s.b[i] > 0.f)) continue;  // warp-uniform
    float dot_g = 0.f, dot_h = 0.f;
    for (int k = 4 * lane; k < D; k += 128) {
      const float4 w = *reinterpret_cast<const float4*>(s.w + k), m = load_tape4<kShared>(tape + i * D + k);
      const float4 d = make_float4(w.x - m.x, w.y - m.y, w.z - m.z, w.w - m.w);
      dot_g += dot4(load_tape4<kShared>(g_m + i * D + k), d);
      dot_h += dot4(*reinterpret_cast<const float4*>(s.h + k), d);
    }
    dot_g = warp_sum(dot_g);
    dot_h = warp_sum(dot_h);
    if (lane == 0) s.p[i] = dot_g, s.q[i] = dot_h;
  }
}

// After the wait: x_i = <g_z, M_t,i> for the slots either undo touches (a_{t+1,i} > 0 or b_i > 0), and
// scalars[0] = <g_z, w> (taken by the warp after the last slot's). M_{t+1} = (1 - b) M_t + b w, so the
// read of step t + 1 needs no second tape: <M_{t+1,i}, g_z> = (1 - b_i) x_i + b_i <g_z, w>.
template <class Cfg, bool kShared>
__device__ __forceinline__ void dots_after_wait(const float* tape, const TapeItemSmem<Cfg>& s) {
  constexpr int D = Cfg::dim, N = Cfg::n_slots, warps = Cfg::threads / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i <= N; i += warps) {
    if (i < N && !(s.a[i] > 0.f || s.b[i] > 0.f)) continue;  // warp-uniform
    float dot = 0.f;
    for (int k = 4 * lane; k < D; k += 128) {
      const float4 other = i < N ? load_tape4<kShared>(tape + i * D + k) : *reinterpret_cast<const float4*>(s.w + k);
      dot += dot4(*reinterpret_cast<const float4*>(s.gz + k), other);
    }
    dot = warp_sum(dot);
    if (lane == 0) (i < N ? s.x[i] : s.scalars[0]) = dot;
  }
}

// One warp, from the dots: the read's g_r = J(a) g_a (in s.r, without the scale s) and the write's
// g_q = J(b) g_b (in s.p), where
//   g_a_i = <M_{t+1,i}, g_z> = (1 - b_i) x_i + b_i <g_z, w>,
//   g_b_i = <g_M_i + a_i g_z + s g_r_i h, w - M_t,i> = p_i + a_i (<g_z, w> - x_i) + s g_r_i q_i;
// scalars[1] = sum_i g_r_i b_i (the w term of the read's part of g_h). Without a read to undo (the last
// step), a = 0 and g_z = 0.
template <class Cfg>
__device__ __forceinline__ void undo_weights(bool read_next, const TapeItemSmem<Cfg>& s) {
  constexpr int N = Cfg::n_slots;
  const int lane = threadIdx.x % 32;
  const float gz_w = read_next ? s.scalars[0] : 0.f;
  for (int i = lane; i < N; i += 32) s.r[i] = s.a[i] > 0.f ? (1.f - s.b[i]) * s.x[i] + s.b[i] * gz_w : 0.f;
  __syncwarp();
  jacobian_product<Cfg>(s.a, s.r);
  float r_dot_b = 0.f;
  for (int i = lane; i < N; i += 32) {
    const float ai = s.a[i], bi = s.b[i], ri = s.r[i];
    r_dot_b += ri * bi;
    if (bi > 0.f) s.p[i] += (ai > 0.f ? ai * (gz_w - s.x[i]) : 0.f) + Cfg::scale * ri * s.q[i];
    else s.p[i] = 0.f;
  }
  r_dot_b = warp_sum(r_dot_b);
  if (lane == 0) s.scalars[1] = r_dot_b;
  __syncwarp();
  jacobian_product<Cfg>(s.b, s.p);
}

// The update pass of both undos, a column of V dimensions a thread, the touched slots four at a time:
//   g_i   = g_M_i + a_i g_z + s g_r_i h                              (the read of step t + 1)
//   g_w  += b_i g_i,    g_M_i = (1 - b_i) g_i + s g_q_i h            (the write of step t)
//   g_h_tape  = s sum_i g_r_i M_{t+1,i} = s sum_i g_r_i (1 - b_i) M_t,i + s (sum_i g_r_i b_i) w
//   g_h_write = s sum_i g_q_i M_t,i
template <class Cfg, bool kShared>
__device__ __forceinline__ void undo_update(const E23BackwardParams& p, int b, int t, bool read_next, float* g_m,
                                            const float* tape, const TapeItemSmem<Cfg>& s) {
  constexpr int D = Cfg::dim, N = Cfg::n_slots, kGroup = 4;
  constexpr int V = D >= 4 * Cfg::threads ? 4 : 2;  // every thread busy at D = 512
  const long long bd = (long long)p.batch * D;
  const float r_dot_b = Cfg::scale * s.scalars[1];
  for (int k = V * threadIdx.x; k < D; k += V * Cfg::threads) {
    const Cols<V> h = load_cols<V, true>(s.h + k), gz = load_cols<V, true>(s.gz + k), w = load_cols<V, true>(s.w + k);
    Cols<V> gw{}, tape_part{}, write_part{};
    for (int i0 = 0; i0 < N; i0 += kGroup) {
      Cols<V> g[kGroup], m[kGroup];
      bool used[kGroup];
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        const int i = i0 + j;
        used[j] = i < N && (s.a[i] > 0.f || s.b[i] > 0.f);  // uniform
        if (used[j]) g[j] = load_cols<V, kShared>(g_m + i * D + k), m[j] = load_cols<V, kShared>(tape + i * D + k);
      }
#pragma unroll
      for (int j = 0; j < kGroup; ++j) {
        if (!used[j]) continue;
        const int i = i0 + j;
        const float ai = s.a[i], bi = s.b[i], gr = Cfg::scale * s.r[i], gq = Cfg::scale * s.p[i];
        const float read_coef = gr * (1.f - bi), keep = 1.f - bi;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          float gi = g[j].v[e];
          if (ai > 0.f) gi += ai * gz.v[e] + gr * h.v[e];
          tape_part.v[e] += read_coef * m[j].v[e];
          if (bi > 0.f) {
            gw.v[e] += bi * gi;
            gi = keep * gi + gq * h.v[e];
            write_part.v[e] += gq * m[j].v[e];
          }
          g[j].v[e] = gi;
        }
        store_cols<V, kShared>(g_m + i * D + k, g[j]);
      }
    }
#pragma unroll
    for (int e = 0; e < V; ++e) tape_part.v[e] += r_dot_b * w.v[e];
    store_cols<V, false>(p.g_w + t * bd + b * D + k, gw);
    store_cols<V, false>(p.g_h_write + b * D + k, write_part);
    if (read_next) store_cols<V, false>(p.g_h_tape + b * D + k, tape_part);
  }
}

// Undoes the read of step 0 for batch row b (s.h = h_0, s.gz = g_z_0, s.a = a_0 loaded, CTA in step), the
// last thing of the backward: g_a_i = <M_0,i, g_z>, g_r = J(a) g_a, dm0_i = g_M_i + a_i g_z + s g_r_i h_0
// (in T), and the tape's part of g_{h_0}, s M_0^T g_r.
template <class Cfg, bool kShared>
__device__ __forceinline__ void undo_first_read(const E23BackwardParams& p, int b, const float* g_m,
                                                const TapeItemSmem<Cfg>& s) {
  constexpr int D = Cfg::dim, N = Cfg::n_slots;
  const float* tape = p.seg_m + (long long)b * N * D;  // entry 0 (entry_of_step(p, 0))
  typename Cfg::T* out = static_cast<typename Cfg::T*>(p.dm0) + (long long)b * N * D;
  slot_dots<Cfg>(tape, s.gz, s.a, s.r);
  __syncthreads();
  if (threadIdx.x < 32) jacobian_product<Cfg>(s.a, s.r);
  __syncthreads();
  for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads) {
    const float4 hk = *reinterpret_cast<const float4*>(s.h + k), gk = *reinterpret_cast<const float4*>(s.gz + k);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i = 0; i < N; ++i) {
      const float ai = s.a[i];
      float4 g = load_tape4<kShared>(g_m + i * D + k);
      if (ai > 0.f) {
        const float gr = Cfg::scale * s.r[i];
        const float4 m = load_state4(tape + i * D + k);
        g = make_float4(g.x + ai * gk.x + gr * hk.x, g.y + ai * gk.y + gr * hk.y, g.z + ai * gk.z + gr * hk.z,
                        g.w + ai * gk.w + gr * hk.w);
        acc = make_float4(acc.x + gr * m.x, acc.y + gr * m.y, acc.z + gr * m.z, acc.w + gr * m.w);
      }
      store_output4(out + i * D + k, g);
    }
    store_state4(p.g_h_tape + b * D + k, acc);
  }
  __syncthreads();
}

// The same tile on tensor cores (bf16 and f16 builds): out = G^T H with G = g[j][r0 ..], H = h[j][c0 ..], the
// sum over j the mma's k. Each fp32 value is split into bf16 hi + lo (as the products split their operand)
// and three products are summed, hi hi + hi lo + lo hi (lo lo and what the split leaves out are about 2^-16
// of a product): the FMA tile's 24 significant bits become about 16, far below the outputs' rounding to T.
// A chunk of 32 rows j is staged in shared memory as bf16 pairs (j, j + 1) in one 32-bit word,
// [64 columns][16 words] for each of g hi, g lo, h hi, h lo, the words of a column XOR-swizzled by its
// bits 1-2 so that the fragment loads (8 columns x 4 words a warp) hit 32 distinct banks. Warp w makes
// outputs 16 (w % 4) .. + 15 by 32 (w / 4) .. + 31: one A fragment and four B fragments a k-step. The order
// of the sum is fixed (mma's own, chunk after chunk): deterministic.
template <class Cfg>
__device__ __forceinline__ void outer_product_tile_mma(const float* g, const float* h, long long rows, int r0, int c0,
                                                       typename Cfg::T* out, float* smem) {
  using B16 = __nv_bfloat16;
  constexpr int D = Cfg::dim, tile = kE23OuterTile, chunk = kE23OuterChunk, words = chunk / 2;
  static_assert(Cfg::threads == 256 && tile == 64 && chunk == 32, "8 warps of 16 x 32 outputs, 16 words a column");
  unsigned* s_g_hi = reinterpret_cast<unsigned*>(smem);  // [64][16] words each
  unsigned* s_g_lo = s_g_hi + tile * words;
  unsigned* s_h_hi = s_g_lo + tile * words;
  unsigned* s_h_lo = s_h_hi + tile * words;
  auto word_at = [](int x, int w) { return x * words + (w ^ (((x >> 1) & 3) << 2)); };
  // Staging: thread (x = tid % 64, pair p0 = tid / 64) loads rows j0 + 2 p, j0 + 2 p + 1 for p = p0 + 4 q
  // (q < 4) of column x of g and of h: a warp's loads of one row are 128 contiguous bytes. Two chunks are
  // in flight ahead of the one being multiplied (one ahead left each chunk waiting about an L2 round trip:
  // 133 us for the 128 chunks of a tile at B = 64).
  const int x = threadIdx.x % tile, p0 = threadIdx.x / tile;
  auto load_chunk = [&](long long j0, float (&gn)[4][2], float (&hn)[4][2]) {
#pragma unroll
    for (int q = 0; q < 4; ++q)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const long long j = j0 + 2 * (p0 + 4 * q) + e;
        gn[q][e] = j < rows && r0 + x < D ? __ldcg(g + j * D + r0 + x) : 0.f;
        hn[q][e] = j < rows && c0 + x < D ? __ldcg(h + j * D + c0 + x) : 0.f;
      }
  };
  auto split = [](const float (&v)[2], unsigned& hi, unsigned& lo) {
    hi = pack2<B16>(v[0], v[1]);
    const float2 r = unpack2<B16>(hi);
    lo = pack2<B16>(v[0] - r.x, v[1] - r.y);
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4;
  const int m0 = 16 * (warp % 4), n0 = 32 * (warp / 4);
  float acc[4][4] = {};
  // Chunk j0 from registers into shared memory, chunk j0 + 2 chunk requested into the same registers, then
  // chunk j0's products.
  auto chunk_products = [&](long long j0, float (&gn)[4][2], float (&hn)[4][2]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int w = word_at(x, p0 + 4 * q);
      split(gn[q], s_g_hi[w], s_g_lo[w]);
      split(hn[q], s_h_hi[w], s_h_lo[w]);
    }
    __syncthreads();
    if (j0 + 2 * chunk < rows) load_chunk(j0 + 2 * chunk, gn, hn);
#pragma unroll
    for (int ks = 0; ks < chunk / 16; ++ks) {
      const int w0 = 8 * ks + tq, w1 = w0 + 4;  // k 2t, 2t + 1 and 8 + 2t, 9 + 2t of the k-step
      const int ra = m0 + gq, rb = ra + 8;
      const unsigned a_hi[4] = {s_g_hi[word_at(ra, w0)], s_g_hi[word_at(rb, w0)], s_g_hi[word_at(ra, w1)],
                                s_g_hi[word_at(rb, w1)]};
      const unsigned a_lo[4] = {s_g_lo[word_at(ra, w0)], s_g_lo[word_at(rb, w0)], s_g_lo[word_at(ra, w1)],
                                s_g_lo[word_at(rb, w1)]};
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int c = n0 + 8 * nt + gq;
        const unsigned b_hi0 = s_h_hi[word_at(c, w0)], b_hi1 = s_h_hi[word_at(c, w1)];
        const unsigned b_lo0 = s_h_lo[word_at(c, w0)], b_lo1 = s_h_lo[word_at(c, w1)];
        mma_16x8x16<B16>(acc[nt], a_hi, b_hi0, b_hi1);
        mma_16x8x16<B16>(acc[nt], a_hi, b_lo0, b_lo1);
        mma_16x8x16<B16>(acc[nt], a_lo, b_hi0, b_hi1);
      }
    }
    __syncthreads();
  };
  float g_even[4][2], h_even[4][2], g_odd[4][2], h_odd[4][2];  // chunks 0, 2, 4, ... and 1, 3, 5, ...
  load_chunk(0, g_even, h_even);
  if (chunk < rows) load_chunk(chunk, g_odd, h_odd);
  for (long long j0 = 0; j0 < rows; j0 += 2 * chunk) {
    chunk_products(j0, g_even, h_even);
    if (j0 + chunk < rows) chunk_products(j0 + chunk, g_odd, h_odd);
  }
  // Accumulator fragments: rows g and g + 8, columns 2t and 2t + 1 of each n-tile.
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = r0 + m0 + gq + 8 * (i / 2), col = c0 + n0 + 8 * nt + 2 * tq + i % 2;
      if (r < D && col < D) out[r * D + col] = from_float<typename Cfg::T>(acc[nt][i]);
    }
}

// out[r][c] = sum_j g[j][r] h[j][c] over j < rows, for the 64 x 64 tile at (r0, c0); g and h are [rows, D]
// fp32. One CTA, a fixed summation order (deterministic).
template <class Cfg>
__device__ __forceinline__ void outer_product_tile(const float* g, const float* h, long long rows, int r0, int c0,
                                   typename Cfg::T* out, float* smem) {
  constexpr int D = Cfg::dim, tile = kE23OuterTile, chunk = kE23OuterChunk;
  static_assert(Cfg::threads == 256, "a 64 x 64 tile is 16 x 16 threads of 4 x 4");
  float* gs = smem;                  // [chunk][64]
  float* hs = smem + chunk * tile;   // [chunk][64]
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  // Chunk j0 + chunk is loaded into registers while chunk j0 is summed from shared memory, so the L2
  // latency of each chunk's loads hides under the previous one's FMAs (at B = 64 the 128 chunks a tile
  // otherwise cost a round trip each on top of their FMAs).
  constexpr int per_thread = chunk * tile / Cfg::threads;
  static_assert(chunk * tile % Cfg::threads == 0, "whole elements a thread");
  float g_next[per_thread], h_next[per_thread];
  auto load_chunk = [&](long long j0) {
#pragma unroll
    for (int q = 0; q < per_thread; ++q) {
      const int e = threadIdx.x + q * Cfg::threads, jj = e / tile, x = e % tile;
      const bool in = j0 + jj < rows;
      g_next[q] = in && r0 + x < D ? __ldcg(g + (j0 + jj) * D + r0 + x) : 0.f;
      h_next[q] = in && c0 + x < D ? __ldcg(h + (j0 + jj) * D + c0 + x) : 0.f;
    }
  };
  float acc[4][4] = {};
  load_chunk(0);
  for (long long j0 = 0; j0 < rows; j0 += chunk) {
#pragma unroll
    for (int q = 0; q < per_thread; ++q) {
      const int e = threadIdx.x + q * Cfg::threads;
      gs[e] = g_next[q], hs[e] = h_next[q];
    }
    __syncthreads();
    if (j0 + chunk < rows) load_chunk(j0 + chunk);
#pragma unroll 8
    for (int jj = 0; jj < chunk; ++jj) {
      const float4 gv = *reinterpret_cast<const float4*>(gs + jj * tile + 4 * ty);
      const float4 hv = *reinterpret_cast<const float4*>(hs + jj * tile + 4 * tx);
      const float gr[4] = {gv.x, gv.y, gv.z, gv.w}, hc[4] = {hv.x, hv.y, hv.z, hv.w};
#pragma unroll
      for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[a][c] += gr[a] * hc[c];
    }
    __syncthreads();
  }
#pragma unroll
  for (int a = 0; a < 4; ++a)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int r = r0 + 4 * ty + a, col = c0 + 4 * tx + c;
      if (r < D && col < D) out[r * D + col] = from_float<typename Cfg::T>(acc[a][c]);
    }
}

// The counters of batch group g (E23BackwardParams::barrier, one 128-byte line each, after the grid
// barrier's): gz counts the group's tiles that stored g_z_t, tape the group's tape items that stored g_w_t
// and their parts of g_{h_{t+1}}. Both only grow during a launch.
__device__ __forceinline__ unsigned* gz_counter(const E23BackwardParams& p, int g) { return p.barrier + 32 * (1 + 2 * g); }
__device__ __forceinline__ unsigned* tape_counter(const E23BackwardParams& p, int g) { return p.barrier + 32 * (2 + 2 * g); }

// Tape item of batch row b at step t (see e23_backward): undo the read of step t + 1 and the write of step
// t in one update pass over g_M, signal; the replay of the segment below follows (tape_item_replay).
//   before the wait   a_{t+1} and the saved operands (h_{t+1}, w_t, b_t); M_t into shared memory (copied,
//                     or at a segment end replayed there); the write's dots that need no g_z
//   after the wait    g_z_{t+1}; one dot a touched slot; both Jacobians (one warp); the update pass
template <class Cfg, bool kShared>
__device__ void tape_item_step(const E23BackwardParams& p, int b, int t, float* smem) {
  constexpr int D = Cfg::dim, N = Cfg::n_slots;
  const int K = p.checkpoint_every, steps = p.steps, j = t / K, k = t % K;
  const int g = b / kGemvTileBatches;
  const long long bd = (long long)p.batch * D, bnd = bd * N;
  const TapeItemSmem<Cfg> s(smem);
  const bool read_next = t < steps - 1;          // step t + 1 exists: its read is undone too
  const bool segment_end = read_next && k == K - 1;  // this segment's last step is still to replay
  backward_mark(p, t, kBMarkTapeStart);
  float* g_m = grad_tape_of<Cfg, kShared>(p, b, smem);
  const float* stored_tape = p.seg_m + entry_of_step(p, t) * bnd + (long long)b * N * D;
  const float* tape = kShared ? undone_tape_in_shared<Cfg>(smem) : stored_tape;
  // a_{t+1} first (a slot a thread, N <= threads): at a segment end its entry is the one the replay of step t
  // overwrites. It goes to shared memory with b_t, after the replay (which uses s.b's room).
  const long long entry_next = read_next ? entry_of_step(p, t + 1) : 0;
  const float a_next = read_next && threadIdx.x < N ? __ldcg(p.seg_a + (entry_next * p.batch + b) * N + threadIdx.x) : 0.f;
  if (segment_end) {  // step K - 1 of this segment: its entry is free now (step t + 1 needs only M_{t+1}'s weights)
    replay_step<Cfg>(p, b, j, K - 1, smem, kShared ? undone_tape_in_shared<Cfg>(smem) : nullptr);
  } else if constexpr (kShared) {
    if (!read_next) copy_tape_async<Cfg>(undone_tape_in_shared<Cfg>(smem), stored_tape);  // else step t + 1 began it
  }
  // b_t (after a segment end's replay, which stores it), h_{t+1} and w_t requested together (load_vectors).
  const int entry = entry_of_step(p, t);
  const float b_now = threadIdx.x < N ? __ldcg(p.seg_b + (entry * (long long)p.batch + b) * N + threadIdx.x) : 0.f;
  {
    float* const dst[2] = {s.h, s.w};
    const float* const src[2] = {p.save_h + (t + 1) * bd + b * D, p.save_w + t * bd + b * D};
    load_vectors<Cfg, 2>(dst, src);
  }
  if (threadIdx.x < N) s.a[threadIdx.x] = a_next, s.b[threadIdx.x] = b_now;
  if (!read_next)
    for (int e = threadIdx.x; e < D; e += Cfg::threads) s.gz[e] = 0.f;
  wait_async_copies();
  __syncthreads();
  write_dots_before_wait<Cfg, kShared>(g_m, tape, s);
  backward_mark(p, t, kBMarkTapeReady);
  if (read_next) {
    // g_z_{t+1} arrives as tagged words (tag steps - t - 1): polling them is the wait, with no counter, no
    // fence on the tiles' side and no second load (the forward's z and w hand-over).
    for (int k = 4 * threadIdx.x; k < D; k += 4 * Cfg::threads)
      *reinterpret_cast<float4*>(s.gz + k) = poll_tagged4(p.g_z_tagged + b * D + k, unsigned(steps - 1 - t));
    __syncthreads();
    backward_mark(p, t, kBMarkTapeGo);
    dots_after_wait<Cfg, kShared>(tape, s);
  }
  __syncthreads();
  if (threadIdx.x < 32) undo_weights<Cfg>(read_next, s);
  __syncthreads();
  backward_mark(p, t, kBMarkTapeWeights);
  undo_update<Cfg, kShared>(p, b, t, read_next, g_m, tape, s);
  signal_counter(tape_counter(p, g));  // g_w_t, g_h_tape, g_h_write are out: the group's tiles may go on
  backward_mark(p, t, kBMarkTapeSignalled);
  // The tape of step t - 1 into shared memory now, so the copy runs under the replay that follows (whose
  // stores go to entries of steps above t - 1, its loads to other entries and the first 3 D + 3 S floats).
  // Not at a segment end: that step's tape is replayed straight into shared memory.
  if constexpr (kShared) {
    const bool next_is_segment_end = t > 0 && (t - 1) % K == K - 1;
    if (t > 0 && !next_is_segment_end)
      copy_tape_async<Cfg>(undone_tape_in_shared<Cfg>(smem), p.seg_m + entry_of_step(p, t - 1) * bnd + (long long)b * N * D);
  }
}

// Off the critical path, after step t of batch row b is undone (while the tiles multiply): replay steps of
// segment j - 1 into the entries of segment j already undone. After step t = j K + k, segment j's steps
// k + 1 .. are free, and their entries are those of segment j - 1's steps 0 .. K - 2 - k (segment_entry);
// step K - 1 follows at the segment end (tape_item_step). The last segment may be short: its first step
// catches up on the steps before.
template <class Cfg>
__device__ void tape_item_replay(const E23BackwardParams& p, int b, int t, float* smem) {
  const int K = p.checkpoint_every, j = t / K, k = t % K;
  if (j == 0) return;
  const int length = min(K, p.steps - j * K), last_k = K - 2 - k;
  for (int kk = k == length - 1 ? 0 : last_k; kk <= last_k; ++kk) replay_step<Cfg>(p, b, j - 1, kk, smem);
}

// A tile's 16 rows of a transposed weight, requested before its wait so their latency hides under it (the
// forward holds its weights for the launch; here a CTA's tiles use two matrices, so they are loaded per
// product, still off the critical path). Where they do not fit in registers (D > 512), gemv_tile loads
// them after the wait, chunk by chunk.
template <class Cfg, class Products>
__device__ __forceinline__ void with_weights_loaded(const typename Cfg::T* w, int row0, Products products) {
  using Held = HeldWeights<typename Cfg::T, Cfg::dim, Cfg::threads / 32>;
  if constexpr (Cfg::tensor_cores && Held::possible) {
    Held held;
    held.load(w, row0);
    products(held);
  } else {
    products(w);
  }
}

// Tile item `tile` (16 rows of W^T, one batch group): the recurrence's part of g_{h_{t+1}},
// W_h^T g_z_{t+1}, into g_h_gemm (for t = -1: of g_{h_0}). Runs while the tape items undo step t.
template <class Cfg>
__device__ void tile_recurrence(const E23BackwardParams& p, int tile, int t, float* smem) {
  using Tr = E23Traits<Cfg>;
  constexpr int D = Tr::D;
  const int row0 = (tile % Tr::row_tiles) * kGemvTileRows, g = tile / Tr::row_tiles;
  const long long bd = (long long)p.batch * D;
  auto store = [&](int b, int r, float sum, int) { __stcg(p.g_h_gemm + b * D + r, sum); };
  with_weights_loaded<Cfg>(static_cast<const typename Tr::T*>(p.w_h_t), row0, [&](const auto& w) {
    backward_mark(p, t, kBMarkRecStart);
    wait_counter(gz_counter(p, g), unsigned(Tr::row_tiles) * unsigned(p.steps - 1 - t));  // g_z_{t+1} of the group
    backward_mark(p, t, kBMarkRecGo);
    gemv_tile<Cfg>(w, State<D>{p.g_z + (t + 1) * bd}, row0, g * kGemvTileBatches, p.batch, smem,
                   smem + Tr::warps * kGemvTileOutputs, store);
  });
  backward_mark(p, t, kBMarkRecDone);
}

// Tile item `tile` at step t, on the critical path: g_{h_{t+1}} = W_w^T g_w_t + dy_t + the write
// scores' part + (t < steps - 1: the read scores' and the recurrence's parts; else dh_final), and
// g_z_t = g_{h_{t+1}} (1 - h_{t+1}^2) -> g_z (kept for dW_h and the next products) and du_t.
// What the tape items do not write (dy_t, the recurrence's part, which this CTA stored itself, dh_final,
// h_{t+1}) and the weights are loaded before the wait, as the forward loads u_t: after it only the
// tape items' parts (with the operand, on tensor cores) and the products remain.
template <class Cfg>
__device__ void tile_gradient(const E23BackwardParams& p, int tile, int t, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, outputs = kGemvTileOutputs / Cfg::threads;
  const int row0 = (tile % Tr::row_tiles) * kGemvTileRows, g = tile / Tr::row_tiles, batch0 = g * kGemvTileBatches;
  const long long bd = (long long)p.batch * D;
  const bool last = t == p.steps - 1;
  const T* dy_t = static_cast<const T*>(p.dy) + t * bd;
  const T* dh_final = static_cast<const T*>(p.dh_final);
  const float* h_next = p.save_h + (t + 1) * bd;
  float* g_z = p.g_z + t * bd;
  T* du_t = static_cast<T*>(p.du) + t * bd;
  float early[outputs], keep[outputs];  // per output j: the parts known before the wait, 1 - h_{t+1}^2
#pragma unroll
  for (int j = 0; j < outputs; ++j) {
    const int2 c = gemv_output<Cfg>(j);
    const int b = batch0 + c.y, r = row0 + c.x, e = b * D + r;
    early[j] = keep[j] = 0.f;
    if (r < D && b < p.batch) {
      early[j] = to_float(dy_t[e]);
      if (!last) early[j] += __ldcg(p.g_h_gemm + e);
      else if (dh_final != nullptr) early[j] += to_float(dh_final[e]);
      const float h = __ldcg(h_next + e);
      keep[j] = 1.f - h * h;
    }
  }
  // The tape items' parts of g_{h_{t+1}}: on tensor cores gemv_tile's addend, requested with the operand;
  // the FMA path has no registers to spare for them (ptxas spills) and adds them last.
  auto parts = [&](int b, int r) {
    const int e = b * D + r;
    float sum = __ldcg(p.g_h_write + e);
    if (!last) sum += __ldcg(p.g_h_tape + e);
    return sum;
  };
  auto finish = [&](int b, int r, float g_h, int j) {
    const int e = b * D + r;
    g_h += early[j];
    if constexpr (!Cfg::tensor_cores) g_h += parts(b, r);
    const float gz = g_h * keep[j];
    __stcg(g_z + e, gz);
    store_tagged(p.g_z_tagged + e, gz, unsigned(p.steps - t));  // the tape items' copy (tile_gradient's tag)
    du_t[e] = from_float<T>(gz);
  };
  const State<D> g_w{p.g_w + t * bd};
  float* stage = smem + Tr::warps * kGemvTileOutputs;
  with_weights_loaded<Cfg>(static_cast<const T*>(p.w_w_t), row0, [&](const auto& w) {
    backward_mark(p, t, kBMarkGradStart);
    wait_counter(tape_counter(p, g), unsigned(min(kGemvTileBatches, p.batch - batch0)) * unsigned(p.steps - t));
    backward_mark(p, t, kBMarkGradGo);
    if constexpr (Cfg::tensor_cores) gemv_tile<Cfg>(w, g_w, row0, batch0, p.batch, smem, stage, finish, parts);
    else gemv_tile<Cfg>(w, g_w, row0, batch0, p.batch, smem, stage, finish);
  });
  signal_counter(gz_counter(p, g));  // g_z_t rows out: the group's tape items and tiles may undo step t
  backward_mark(p, t, kBMarkGradDone);
}

// Steps T - 1 down to 0, then step 0's read (-> dm0) and the recurrence's part of g_{h_0}. No grid
// barrier: each side waits on its batch group's counters for what it reads (the forward's scheme,
// docs/e23.md "Backward through time on the GPU"). A CTA does, per step, its tiles' recurrence products,
// its tape items, its tiles' gradient products, then its replay work; every wait is on work of an earlier
// one of these stages, so with every CTA resident nothing deadlocks. With p.state_in_shared, g_M is on
// chip (its tape item CTA starts it from dm_final here; else the prologue filled the workspace's). The
// tape item functions are instantiated for both places and picked per call (as in the forward): the
// whole loop instantiated twice cost 85 registers more and spilled.
template <class Cfg>
__device__ void backward_steps(const E23BackwardParams& p, float* smem) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  const int batch = p.batch, steps = p.steps;
  const int items = batch + Tr::row_tiles * ((batch + kGemvTileBatches - 1) / kGemvTileBatches);
  if (p.state_in_shared) {
    const T* dm_final = static_cast<const T*>(p.dm_final);
    for (int item = blockIdx.x; item < batch; item += gridDim.x) {
      float* g_m = grad_tape_of<Cfg, true>(p, item, smem);
      for (int e = threadIdx.x; e < N * D; e += Cfg::threads)
        g_m[e] = dm_final != nullptr ? to_float(dm_final[(long long)item * N * D + e]) : 0.f;
    }
    __syncthreads();
  }
  for (int t = steps - 1; t >= 0; --t) {
    if (t < steps - 1)
      for (int item = blockIdx.x; item < items; item += gridDim.x)
        if (item >= batch) tile_recurrence<Cfg>(p, item - batch, t, smem);
    for (int item = blockIdx.x; item < batch; item += gridDim.x) {
      if (p.state_in_shared) tape_item_step<Cfg, true>(p, item, t, smem);
      else tape_item_step<Cfg, false>(p, item, t, smem);
    }
    for (int item = blockIdx.x; item < items; item += gridDim.x)
      if (item >= batch) tile_gradient<Cfg>(p, item - batch, t, smem);
    for (int item = blockIdx.x; item < batch; item += gridDim.x) tape_item_replay<Cfg>(p, item, t, smem);
    if (blockIdx.x < batch) backward_mark(p, t, kBMarkTapeReplayed);
  }
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    if (item < batch) {
      const TapeItemSmem<Cfg> s(smem);
      load_vector<Cfg>(s.h, p.save_h + item * D);
      for (int i = threadIdx.x; i < N; i += Cfg::threads) s.a[i] = __ldcg(p.seg_a + (long long)item * N + i);  // entry 0
      wait_counter(gz_counter(p, item / kGemvTileBatches), unsigned(Tr::row_tiles) * unsigned(steps));
      load_vector<Cfg>(s.gz, p.g_z + item * D);
      __syncthreads();
      if (p.state_in_shared) undo_first_read<Cfg, true>(p, item, grad_tape_of<Cfg, true>(p, item, smem), s);
      else undo_first_read<Cfg, false>(p, item, grad_tape_of<Cfg, false>(p, item, smem), s);
    } else {
      tile_recurrence<Cfg>(p, item - batch, -1, smem);
    }
  }
}

// One CTA an SM is asked for: ptxas then gives the kernel 120 to 185 registers and spills none, where
// holding it to 128 (two CTAs an SM) spilled up to 250 bytes; the goal shapes have at most 128 items
// (a CTA each on 132 SMs), and a larger batch only gives a CTA more items.
template <class Cfg>
__global__ void __launch_bounds__(Cfg::threads, 1) e23_backward(const E23BackwardParams p) {
  using Tr = E23Traits<Cfg>;
  using T = typename Tr::T;
  constexpr int D = Tr::D, N = Tr::N;
  extern __shared__ float4 shared4[];
  float* smem = reinterpret_cast<float*>(shared4);

  const int batch = p.batch, steps = p.steps, K = p.checkpoint_every;
  const long long bd = (long long)batch * D;
  const int items = batch + Tr::row_tiles * ((batch + kGemvTileBatches - 1) / kGemvTileBatches);
  const long long thread = (long long)blockIdx.x * Cfg::threads + threadIdx.x, threads = (long long)gridDim.x * Cfg::threads;
  GridBarrier barrier{p.barrier};
  backward_mark(p, steps, kBLaunchStart);

  // Prologue: W^T for the tiles, g_M_T = dm_final (or 0). When the grid has CTAs besides the tape items'
  // (the front end sizes it for the dW tiles too), those write W^T while the tape items replay.
  {
    const T* w_h = static_cast<const T*>(p.w_h);
    const T* w_w = static_cast<const T*>(p.w_w);
    T* w_h_t = static_cast<T*>(p.w_h_t);
    T* w_w_t = static_cast<T*>(p.w_w_t);
    const bool others = int(gridDim.x) > batch;
    const long long first = others ? thread - (long long)batch * Cfg::threads : thread;
    const long long stride = others ? threads - (long long)batch * Cfg::threads : threads;
    for (long long e = first; e >= 0 && e < (long long)D * D; e += stride) {
      const int r = int(e / D), c = int(e % D);  // read row-major (coalesced), write transposed
      w_h_t[c * D + r] = w_h[e];
      w_w_t[c * D + r] = w_w[e];
    }
    const T* dm_final = static_cast<const T*>(p.dm_final);
    if (!p.state_in_shared)
      for (long long e = thread; e < bd * N; e += threads) p.g_m[e] = dm_final != nullptr ? to_float(dm_final[e]) : 0.f;
  }
  // The last segment (the first undone) is replayed whole before any step; each later one a step at a
  // time while the one after it is undone (tape_item_replay).
  {
    const int last_segment = (steps - 1) / K;
    for (int item = blockIdx.x; item < batch; item += gridDim.x)
      for (int k = 0; k < steps - last_segment * K; ++k) replay_step<Cfg>(p, item, last_segment, k, smem);
  }
  barrier.sync();
  backward_mark(p, steps, kBLaunchStepsBegin);

  backward_steps<Cfg>(p, smem);
  backward_mark(p, steps, kBLaunchStepsEnd);
  barrier.arrive();
  if (int(blockIdx.x) < items) barrier.wait();
  else barrier.wait_sleeping(500);  // a CTA for dW only: no need to poll the counter at full rate all launch long
  backward_mark(p, steps, kBLaunchOuterBegin);
  T* dh0 = static_cast<T*>(p.dh0);
  for (long long e = thread; e < bd; e += threads)
    dh0[e] = from_float<T>(__ldcg(p.g_h_tape + e) + __ldcg(p.g_h_gemm + e));
  // dW_w = sum over (t, b) of g_w_t h_{t+1}^T; dW_h = sum of g_z_t h_t^T.
  constexpr int tiles_1d = (D + kE23OuterTile - 1) / kE23OuterTile;
  for (int tile = blockIdx.x; tile < 2 * tiles_1d * tiles_1d; tile += gridDim.x) {
    const bool write_side = tile < tiles_1d * tiles_1d;
    const int local = tile % (tiles_1d * tiles_1d);
    const int r0 = (local / tiles_1d) * kE23OuterTile, c0 = (local % tiles_1d) * kE23OuterTile;
    const long long rows = (long long)steps * batch;  // one per (t, b)
    const float* g = write_side ? p.g_w : p.g_z;
    const float* h = write_side ? p.save_h + bd : p.save_h;
    T* out = static_cast<T*>(write_side ? p.dw_w : p.dw_h);
    if constexpr (Cfg::tensor_cores) outer_product_tile_mma<Cfg>(g, h, rows, r0, c0, out, smem);
    else outer_product_tile<Cfg>(g, h, rows, r0, c0, out, smem);
  }
  backward_mark(p, steps, kBLaunchEnd);
}

}  // namespace sjit_kernels
