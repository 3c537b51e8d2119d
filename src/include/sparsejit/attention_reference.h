// Float64 CPU reference for softmax attention (masked, causal, grouped-query), forward and backward.
// It is the oracle for the GPU attention kernels: written from the definitions with plain loops, so a
// reader can check it against the math line by line. Cost is O(batch * heads_q * seq_q * seq_k * head_dim).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace sjit::reference {

// Which keys a query row may see, besides causality: allowed(head, i, j) with head the *query* head,
// i the query index and j the key index (batch is not passed: a pattern is the same for every batch).
// An empty function allows every key. Block-sparse patterns are expanded into this by the caller, so the
// reference never depends on a block size.
using KeyFilter = std::function<bool(std::int64_t head, std::int64_t i, std::int64_t j)>;

struct AttentionProblem {
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0, head_dim = 0;
  double scale = 0;                  // softmax scale on q.k; 0 means 1/sqrt(head_dim)
  bool causal = false;
  bool causal_bottom_right = false;  // only with causal: query i sees key j iff j <= i (top-left, the
                                     // default) or j <= i + seq_k - seq_q (bottom-right: the last query
                                     // sees the last key, as in decoding with a KV cache)
  KeyFilter filter;                  // optional; applied on top of causality
};

// Tensor layouts, all contiguous row-major:
//   q, o, dq, d_o  [batch, heads_q,  seq_q, head_dim]
//   k, v, dk, dv   [batch, heads_kv, seq_k, head_dim]
//   lse            [batch, heads_q,  seq_q]
// Grouped-query attention (GQA; MQA when heads_kv = 1): query head h reads kv head h / (heads_q / heads_kv),
// so consecutive query heads share a kv head.
//
// Validation: throws sjit::InvalidArgument (sparsejit/error.h), naming the field and its value, when
// batch, seq_q or seq_k < 0, heads_q or heads_kv < 1, head_dim < 1, heads_q % heads_kv != 0, scale is
// not finite, or a span's length differs from its layout's element count. Empty sequences (seq_q = 0 or
// seq_k = 0) and batch = 0 are allowed and give empty or zero results.

struct AttentionOutput {
  std::vector<double> o;    // [batch, heads_q, seq_q, head_dim]
  std::vector<double> lse;  // [batch, heads_q, seq_q], natural log
};

// With s_ij = scale * q_i . k_j and A_i the keys that attention_allows for row i:
//   lse_i = log sum_{j in A_i} exp(s_ij)              (natural log, as FlashAttention stores it)
//   P_ij  = exp(s_ij - lse_i) for j in A_i, else 0
//   o_i   = sum_j P_ij v_j
// computed stably: the row max is subtracted before exp, so any finite scores work. A row with no
// allowed key (A_i empty: a fully masked row, or seq_k = 0) gets o_i = 0 and lse_i = -infinity, never
// NaN; that is the limit kernels reach with an online softmax that starts from max = -inf and sum = 0
// and guards the final division. Non-finite q or k give IEEE arithmetic's results, unspecified here.
AttentionOutput attention_forward(const AttentionProblem& p, std::span<const double> q, std::span<const double> k,
                                  std::span<const double> v);

struct AttentionGradients {
  std::vector<double> dq;  // [batch, heads_q,  seq_q, head_dim]
  std::vector<double> dk;  // [batch, heads_kv, seq_k, head_dim]
  std::vector<double> dv;  // [batch, heads_kv, seq_k, head_dim]
};

// Gradients of a loss L given d_o = dL/do, by the analytic backward of FlashAttention-2 (Dao 2023,
// "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning", Algorithm 2):
//   D_i   = rowsum(dO_i * O_i)              (= sum_j P_ij dP_ij, the softmax Jacobian's rank-one term)
//   dP_ij = dO_i . v_j
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ_i  = scale sum_j dS_ij k_j
//   dK_j  = scale sum_i dS_ij q_i,   dV_j = sum_i P_ij dO_i
// P is recomputed from q and k as in the forward. Under GQA, dK and dV of a kv head sum the
// contributions of every query head in its group. A row with no allowed key has P_i = 0, so it
// contributes exactly 0 to dq, dk and dv (its dq row is 0).
AttentionGradients attention_backward(const AttentionProblem& p, std::span<const double> q, std::span<const double> k,
                                      std::span<const double> v, std::span<const double> d_o);

// Whether query row i of query head `head` may see key j: causality (if p.causal, with its alignment)
// and p.filter (if set). Does not validate p or the indices.
bool attention_allows(const AttentionProblem& p, std::int64_t head, std::int64_t i, std::int64_t j);

}  // namespace sjit::reference
