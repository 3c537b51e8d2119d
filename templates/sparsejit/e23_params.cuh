// The arguments of one E23 forward launch. Plain types only: this header is compiled by NVRTC for the
// kernel and by the host compiler for the front end, and both must agree on the layout.
#pragma once

namespace sjit_kernels {

// Opt-in timing of a forward launch (E23ForwardParams::profile, docs/e23.md "Where the time goes"): thread 0
// of every CTA records, at each of these points of every step, clock64() and %globaltimer (ns) as a pair
// of 64-bit words at profile[((cta * steps + t) * kE23Marks + mark) * 2]. A point a CTA does not reach
// in a step (a tile CTA has no tape marks) stays as the caller zeroed it.
enum E23Mark : int {
  kMarkTileStart,      // tile item: before waiting for h_t
  kMarkTileGo,         // h_t of the tile's batch group is out
  kMarkTileProducts,   // the warps' partial products in shared memory
  kMarkTileDone,       // z_t or w_{t-1} stored
  kMarkTapeStart,      // tape item: own state requested, before polling z_t, w_{t-1}
  kMarkTapeGo,         // z_t (tensor cores) and w_{t-1} arrived, in registers and shared memory
  kMarkTapeNormed,     // the read weights a
  kMarkTapeSignalled,  // h_{t+1} stored and signalled
  kMarkTapeDone,       // the write's scores and weights for the next phase
  kE23Marks
};

// The same for a backward launch (E23BackwardParams::profile): per step t (from T - 1 down to 0) the
// points below at profile[((cta * (steps + 1) + t) * kE23BackwardMarks + mark) * 2]; the extra step slot
// `steps` holds the launch's own points (E23BackwardLaunchMark).
enum E23BackwardMark : int {
  kBMarkRecStart,       // tile: weights requested, before waiting for g_z_{t+1} of the group
  kBMarkRecGo,          // g_z_{t+1} of the group is out
  kBMarkRecDone,        // W_h^T g_z_{t+1} stored (the recurrence's part)
  kBMarkGradStart,      // tile: dy_t and the parts requested, before waiting for the tape items of step t
  kBMarkGradGo,         // the group's tape items of step t signalled
  kBMarkGradDone,       // g_z_t stored (and tagged) and signalled
  kBMarkTapeStart,      // tape item: step t begins (a segment end replays here)
  kBMarkTapeReady,      // saved operands loaded, the write's dots done: polling g_z_{t+1} next
  kBMarkTapeGo,         // g_z_{t+1} arrived
  kBMarkTapeWeights,    // the dots after the wait and both Jacobians done
  kBMarkTapeSignalled,  // the update pass stored and signalled
  kBMarkTapeReplayed,   // the replay steps of the segment below done
  kE23BackwardMarks
};
enum E23BackwardLaunchMark : int {
  kBLaunchStart,        // the kernel began
  kBLaunchStepsBegin,   // W^T written and the last segment replayed (after the grid barrier)
  kBLaunchStepsEnd,     // the steps and step 0's read undone (before the grid barrier)
  kBLaunchOuterBegin,   // after the grid barrier: dh0, then dW
  kBLaunchEnd,          // dW tiles done
  kE23BackwardLaunchMarks
};
static_assert(int(kE23BackwardLaunchMarks) <= int(kE23BackwardMarks), "the launch's points share a step slot's room");

struct E23ForwardParams {
  // Inputs, in the spec's element type T (row-major, docs/e23.md "Shapes and layouts").
  const void* u;    // [steps, batch, D]
  const void* h0;   // [batch, D]
  const void* m0;   // [batch, N, D]
  const void* w_h;  // [D, D]
  const void* w_w;  // [D, D]
  // Outputs in T; h_final and m_final may be null.
  void* y;          // [steps, batch, D]
  void* h_final;    // [batch, D]
  void* m_final;    // [batch, N, D]
  // Optional [steps] means over batch rows of the read and write support sizes; zeroed before launch.
  float* read_support;
  float* write_support;
  // Workspace, fp32: the state between steps and the values passed between CTAs inside one step.
  // Counters, zeroed before launch, one 128-byte line (32 words) each: [0] the grid barrier of the end,
  // then per batch group g of 32 rows: [32 (1 + g)] tape items done.
  unsigned* barrier;
  float* h;           // [batch, D]     h_t
  // Tagged words (value, phase + 1), zeroed before launch: the products hand these to the tape items.
  unsigned long long* z;  // [batch, D]  W_h h_t + u_t
  unsigned long long* w;  // [batch, D]  write value W_w h_{t+1}
  float* m;           // [batch, N, D]  tape M_t
  float* q;           // [batch, N]     write scores s M_t h_{t+1} of the last step (the next read's basis)
  float* b;           // [batch, N]     write weights of the last step, applied at the start of the next
  // Saved for the backward (all null when not saving; docs/e23.md "Backward through time on the GPU").
  float* save_h;      // [steps + 1, batch, D]  h_0 .. h_T in fp32
  float* save_w;      // [steps, batch, D]      write values w_t
  float* save_m;      // [ceil(steps / K), batch, N, D]  the tape M_t at t = 0, K, 2K, ...
  int checkpoint_every;  // K >= 1
  int batch, steps;
  // 1: each batch row's tape stays in the shared memory of the CTA that owns its tape item for the whole
  // launch (the grid has a CTA per batch row and the launch asks for the room); p.m is then unused.
  int tape_in_shared;
  // Null, or [grid, steps, kE23Marks, 2] 64-bit words, zeroed before launch: the per-phase timing above.
  unsigned long long* profile;
  // Testing the hand-overs (SJIT_E23_TILE_LAG_NS, docs/e23.md): from step 1 on, the z tile of row tile r
  // waits r x tile_lag_ns nanoseconds before it reads h_t, so that the tape items go on (their w words
  // and the first z words are in) while later z tiles have yet to read h_t. 0 in every normal launch.
  unsigned tile_lag_ns;
};

struct E23BackwardParams {
  // Inputs in T. dh_final and dm_final may be null (zero).
  const void* w_h;       // [D, D]
  const void* w_w;       // [D, D]
  const void* dy;        // [steps, batch, D]
  const void* dh_final;  // [batch, D]
  const void* dm_final;  // [batch, N, D]
  // What the forward saved (fp32, see E23ForwardParams).
  const float* save_h;   // [steps + 1, batch, D]
  const float* save_w;   // [steps, batch, D]
  const float* save_m;   // [ceil(steps / K), batch, N, D]
  // Outputs in T.
  void* du;    // [steps, batch, D]
  void* dh0;   // [batch, D]
  void* dm0;   // [batch, N, D]
  void* dw_h;  // [D, D]
  void* dw_w;  // [D, D]
  // Workspace, fp32 unless said.
  unsigned* barrier;  // grid barrier counter, zeroed before launch
  void* w_h_t;        // [D, D] in T: W_h transposed (made by the kernel's prologue)
  void* w_w_t;        // [D, D] in T: W_w transposed
  float* g_m;         // [batch, N, D]     g_{M_t}, carried down the steps
  float* seg_m;       // [K, batch, N, D]  the tapes of the segment being undone, replayed from its checkpoint
  float* seg_a;       // [K, batch, N]     their read weights a_t
  float* seg_b;       // [K, batch, N]     and write weights b_t
  float* g_w;         // [steps, batch, D] g_{w_t} (kept for dW_w)
  float* g_z;         // [steps, batch, D] g_{z_t} (kept for dW_h)
  float* g_h_tape;    // [batch, D]  the tape's part of g_{h_t}:  s M_t^T g_r (read scores)
  float* g_h_gemm;    // [batch, D]  the recurrence's part:        W_h^T g_z_t
  float* g_h_write;   // [batch, D]  the write scores' part of g_{h_{t+1}}: s M_t^T g_q
  // [batch, D] g_{z_t} again as tagged words (value and steps - t, e23_grid_sync.cuh), zeroed before
  // launch: the tape items poll them instead of waiting on the tiles' counter.
  unsigned long long* g_z_tagged;
  int checkpoint_every;
  int batch, steps;
  // 1: each batch row's g_M and the tape of the step being undone stay in the shared memory of the CTA
  // that owns its tape item (the grid has a CTA per batch row and the launch asks for the room); p.g_m is
  // then unused.
  int state_in_shared;
  // Null, or [grid, steps + 1, kE23BackwardMarks, 2] 64-bit words, zeroed before launch (E23BackwardMark).
  unsigned long long* profile;
};

}  // namespace sjit_kernels
