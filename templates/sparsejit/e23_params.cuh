// The arguments of one E23 forward launch. Plain types only: this header is compiled by NVRTC for the
// kernel and by the host compiler for the front end, and both must agree on the layout.
#pragma once

namespace sjit_kernels {

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
  unsigned* barrier;  // grid barrier counter, zeroed before launch
  float* h;           // [batch, D]     h_t
  float* z;           // [batch, D]     W_h h_t + u_t
  float* v;           // [batch, D]     read value sum_i a_i M_i
  float* w;           // [batch, D]     write value W_w h_{t+1}
  float* m;           // [batch, N, D]  tape M_t
  float* b;           // [batch, N]     write weights of the last step, applied at the start of the next
  int batch, steps;
};

}  // namespace sjit_kernels
