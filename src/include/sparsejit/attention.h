// Fused softmax attention on the GPU, dense or block-sparse: O = softmax(scale Q K^T | mask) V and the
// log-sum-exp of every row. docs/attention.md has the semantics, layouts and performance.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sparsejit/attention_spec.h"
#include "sparsejit/device.h"
#include "sparsejit/pattern.h"

namespace sjit {

struct AttentionInternals;

// Which forward kernel body runs: mma.sync (sm_80 and later), wgmma (Hopper, sm_90a only: one CTA a
// query tile), wgmma_ws (Hopper: persistent CTAs, one an SM, whose copy warp loads the next work
// item's tiles under the current one's math; FlashAttention-3's structure), or wgmma_gather (Hopper,
// pattern blocks of 16 and 32: one warpgroup a query block, the keys of its active blocks gathered 64
// at a time and the products computed transposed, keys as rows; docs/attention.md).
// automatic: the default for the device when every tiling field is unset, else mma (a tiling written
// for the mma.sync kernel keeps meaning that kernel). The backward's dK/dV pass runs on wgmma on
// sm_90a at head_dim 128 unless the config says mma explicitly.
enum class AttentionPath { automatic, mma, wgmma, wgmma_ws, wgmma_gather };

// A kernel's tiling (the tuner's knobs). Zero fields are filled by the heuristic default.
// The query tile is 16 * m_tiles * warps rows; each warp owns 16 * m_tiles of them. On the wgmma path
// m_tiles is 1 and each group of 4 warps (a warpgroup) owns 64 rows. On wgmma_gather the query tile
// is one pattern block (block_n, which is the pattern's block size) of m_tiles query heads (1, 2 or 4,
// at most 64 queries: heads of one K/V head that share the pattern, which then read each key block
// once for all of them), and the 4 warps share it.
struct AttentionConfig {
  int warps = 0;           // 4 or 8
  int m_tiles = 0;         // 16-row tensor-core tiles per warp: 1 or 2 (wgmma_gather: query heads a CTA)
  int block_n = 0;         // keys per tile: 16, 32, 64 or 128
  int stages = 0;          // K/V ring slots: 2 or 3 (up to 4 on wgmma_ws)
  int q_in_registers = -1; // 1: Q fragments live in registers; 0: re-read from shared memory; -1: choose
  AttentionPath path = AttentionPath::automatic;

  friend bool operator==(const AttentionConfig&, const AttentionConfig&) = default;
  int block_m() const { return path == AttentionPath::wgmma_gather ? block_n : 16 * m_tiles * warps; }
};

// "warps=4,mt=2,bn=64,stages=2,qreg=0,path=mma"; the path is left out while automatic, and text
// without it parses as automatic.
std::string key(const AttentionConfig& config);
AttentionConfig parse_attention_config(std::string_view text);
std::string_view name(AttentionPath path);  // "auto", "mma", "wgmma", "wgmma_ws", "wgmma_gather"
// Whether the path runs a Hopper kernel (wgmma, wgmma_ws or wgmma_gather).
bool on_wgmma(AttentionPath path);

// compute_capability: 10 * major + minor of the device the kernel will run on, or 0 for "any"
// (portable defaults, the mma.sync path).
AttentionConfig default_config(const AttentionSpec& spec, int compute_capability = 0);
// Fills the unset fields and checks the result against the spec (shared memory, tile shape); throws
// InvalidArgument naming the field.
AttentionConfig resolve(const AttentionSpec& spec, AttentionConfig config, int compute_capability = 0);

// Strides of a [batch, heads, seq, head_dim] tensor in elements; the head_dim stride is 1.
struct Strides {
  std::int64_t batch = 0, head = 0, row = 0;
  static Strides bhsd(std::int64_t heads, std::int64_t seq, std::int64_t head_dim);  // contiguous [B, H, S, D]
  static Strides bshd(std::int64_t heads, std::int64_t seq, std::int64_t head_dim);  // contiguous [B, S, H, D]
  friend bool operator==(const Strides&, const Strides&) = default;
};

// The persistent Hopper forward (path wgmma_ws) takes one work item (a query tile of a head) a CTA a
// round, so its last round of CTAs is part full where the items do not fill it. split shares that
// round's items out among all the CTAs by key tiles, each item's pieces merged by the piece that ends
// it (docs/attention.md, "The last round split across CTAs"); whole takes every item whole; automatic
// splits where the items are of one length (dense, or a pattern with as many key tiles in every row;
// not causal) and long enough for the gain to cover the merge. A split item's output is the same from
// run to run, but not bit for bit that of the item taken whole. Under a CUDA graph capture the split
// needs the stream's scratch from an earlier call on that stream (prepare_forward), else every item is
// whole.
enum class LastRound { automatic, whole, split };
std::string_view name(LastRound mode);  // "auto" | "whole" | "split"
LastRound parse_last_round(std::string_view text);

struct AttentionForwardArgs {
  const void* q = nullptr;  // [B, Hq, Sq, D] of spec.dtype
  const void* k = nullptr;  // [B, Hkv, Sk, D]
  const void* v = nullptr;  // [B, Hkv, Sk, D]
  void* o = nullptr;        // [B, Hq, Sq, D]
  float* lse = nullptr;     // optional [B, Hq, Sq] contiguous: natural-log log-sum-exp, -inf for empty rows
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0;
  // Zero strides mean contiguous [B, H, S, D]. Every stride must be a multiple of 8 elements and every
  // pointer 16-byte aligned (the kernels move 16-byte chunks). o must not share memory with k or v:
  // the check compares address ranges, so o inside a packed [B, S, 3, H, D] qkv buffer is refused.
  Strides q_strides, k_strides, v_strides, o_strides;
  float scale = 0.0f;       // 0 means 1 / sqrt(head_dim)
  // block_sparse: the pattern (its block size must be the spec's; shape ceil(Sq/bs) x ceil(Sk/bs);
  // heads 1 or Hq). baked: may be null (the baked pattern is used) or must equal it.
  const BlockPattern* pattern = nullptr;
  // How the persistent Hopper kernel (path wgmma_ws) runs its last, part-full round of CTAs (see
  // LastRound).
  LastRound last_round = LastRound::automatic;
};

// How a backward sums dQ: atomic, fp32 atomic adds inside the dK/dV pass (the last bits vary from
// run to run); pass, a dQ pass of its own that owns its rows (the same inputs give the same bits).
enum class DqSummation { atomic, pass };
std::string_view name(DqSummation s);  // "atomic" | "pass"

// How a block-sparse backward's dK/dV pass walks the query blocks its keys see (docs/attention.md,
// "Small pattern blocks in the backward"): tiles, the contiguous query tiles holding an active block
// (dense specs, blocks as wide as the tiles, and wherever packing would not pay); packed, tiles filled
// from runs of one active block each, wherever they lie (pattern blocks narrower than the tiles);
// gathered, a pattern block of keys a CTA with its query blocks gathered (sparse random blocks of 16,
// 32 and 64 on Hopper). AttentionBackwardArgs::walk asks for one; SJIT_BACKWARD_WALK=tiles|packed|gathered
// forces one, for measuring (falling back where the pattern cannot take it).
enum class BackwardWalk { tiles, packed, gathered };
std::string_view name(BackwardWalk w);  // "tiles" | "packed" | "gathered"

struct AttentionBackwardArgs {
  const void* q = nullptr;    // the forward's inputs
  const void* k = nullptr;
  const void* v = nullptr;
  const void* o = nullptr;    // the forward's output
  const float* lse = nullptr; // the forward's log-sum-exp [B, Hq, Sq] (required)
  const void* d_o = nullptr;  // gradient of the loss with respect to o, [B, Hq, Sq, D]
  void* dq = nullptr;         // [B, Hq, Sq, D]
  void* dk = nullptr;         // [B, Hkv, Sk, D]: summed over the query heads of each group
  void* dv = nullptr;         // [B, Hkv, Sk, D]
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0;
  Strides q_strides, k_strides, v_strides, o_strides, do_strides, dq_strides, dk_strides, dv_strides;  // 0: contiguous
  float scale = 0.0f;         // the forward's scale (0 means 1 / sqrt(head_dim))
  const BlockPattern* pattern = nullptr;  // as in the forward
  // How to sum dQ. Unset: chosen per call, in this order: SJIT_BACKWARD_DQ (atomic or pass), the
  // winner tune_dq_summation stored for this device, spec, GQA group and key tiles a query row (read
  // where SJIT_AUTOTUNE is on or force), the rule measured on the H100 (docs/attention.md). A spec
  // that must take the pass (deterministic, or head_dim 256) refuses atomic.
  std::optional<DqSummation> dq_summation;
  // How the dK/dV pass walks the pattern's query blocks (BackwardWalk), and the queries of its tiles
  // (64 or 128; 0 leaves them to be chosen; only d = 64 with pattern blocks of 16 or 32 on Hopper has
  // both, elsewhere the one the spec runs may be asked). Unset, chosen per call in this order:
  // SJIT_BACKWARD_WALK and SJIT_BACKWARD_QUERY_TILES, the winner tune_backward_walk stored for this
  // device, spec, pattern and GQA group (read where SJIT_AUTOTUNE is on or force; with it its way of
  // summing dQ, where dq_summation and SJIT_BACKWARD_DQ leave that open), the rules measured on the H100
  // and the H200 (docs/attention.md); query tiles asked without a walk leave the rules to choose
  // between tiles and packed, the walks that have them. A walk or tile width this backward cannot run
  // (packed blocks as wide as the tiles, gathered blocks of 128, a pattern with every block active,
  // 128-query tiles at d = 128, query tiles with the gathered walk) is refused with InvalidArgument,
  // naming what it runs.
  std::optional<BackwardWalk> walk;
  int query_tile_cols = 0;
};

// A prepared attention: compiles (or finds) its kernel once, keeps the device copy of each pattern's
// tile schedule, then launches with little host work. Thread-safe. The spec's pass is ignored.
class Attention {
 public:
  explicit Attention(const AttentionSpec& spec, const AttentionConfig& config = {});
  // A baked kernel: the spec's sparsity becomes baked and its digest the pattern's.
  Attention(const AttentionSpec& spec, const BlockPattern& baked_pattern, const AttentionConfig& config = {});
  ~Attention();
  Attention(Attention&&) noexcept;
  Attention& operator=(Attention&&) noexcept;

  // Compiles and loads the forward's kernel for the current device now (warm-up).
  void prepare();
  // Also builds and uploads a pattern's tile schedule now (or, for a pattern with every block active,
  // readies the dense kernel it runs on), so that a later forward with it only launches: such a
  // forward can be captured into a CUDA graph (begin_capture in sparsejit/device.h).
  void prepare(const BlockPattern& pattern);
  // Everything backward(args, stream) does besides launching: compiles its kernels (for the way it
  // would sum dQ), builds and uploads the pattern's schedules, and allocates the stream's scratch for
  // args' shape. A later backward with the same shape and pattern on `stream` (or a smaller shape)
  // only launches, so it can be captured into a CUDA graph. Checks args as backward does.
  void prepare_backward(const AttentionBackwardArgs& args, Stream stream = nullptr);
  // Everything forward(args, stream) does besides launching: prepare(*args.pattern) (or prepare()),
  // and where the persistent kernel would split its last round (LastRound), the stream's scratch for
  // it. A later forward with the same shape on `stream` then splits under a CUDA graph capture too
  // (without it, a captured forward takes every item whole). Checks args as forward does.
  void prepare_forward(const AttentionForwardArgs& args, Stream stream = nullptr);

  // While `stream` is being captured into a graph, forward and backward refuse (InvalidArgument,
  // naming the prepare call) where they would first compile, upload or allocate. A graph uses the
  // schedules and the scratch of the stream it was captured on, which this object keeps until it is
  // destroyed: replay it on that stream, or at least never beside other backward calls on it.
  void forward(const AttentionForwardArgs& args, Stream stream = nullptr);
  // Gradients of the forward with the same spec, pattern and scale. spec.deterministic chooses how dQ
  // is summed (see AttentionSpec). Scratch is kept per stream between calls: 8 bytes per query row,
  // plus 4 * head_dim with atomic dQ.
  void backward(const AttentionBackwardArgs& args, Stream stream = nullptr);

  // How backward(args) sums dQ on the current device: DqSummation::pass whenever spec.deterministic,
  // otherwise whichever way is faster for these args (see AttentionSpec::deterministic). Checks args
  // as backward does and builds the pattern's key-major schedule (an upload: call it outside a
  // capture, or after prepare_backward); launches nothing.
  DqSummation dq_summation(const AttentionBackwardArgs& args);
  // The key text of the dK/dV pass's tiling that backward(args) runs on the current device (the same
  // checks and schedule as dq_summation): "...,path=wgmma_gather,block=16" where a sparse pattern of
  // blocks of 16 or 32 runs the gathered backward on Hopper (docs/attention.md, "Small pattern blocks
  // in the backward: the gathered passes"), the 128-key pass's elsewhere (the dense kernels' where
  // every block is active).
  std::string backward_tiling(const AttentionBackwardArgs& args);
  // How that dK/dV pass walks the pattern's query blocks (the same checks and schedule as
  // dq_summation): BackwardWalk::tiles without a pattern, or where every block is active.
  BackwardWalk backward_walk(const AttentionBackwardArgs& args);

  const AttentionSpec& spec() const;
  AttentionConfig config() const;  // after resolve()
  // The tiling a forward with `pattern` runs on the current device. That is config(), except:
  // - a pattern with every block active runs on the dense kernels, with their default tiling;
  // - with pattern blocks of 16 or 32, on Hopper, an object built without a tiling (none given, none
  //   stored by the tuner) runs a pattern whose active blocks fill most of the 128-row tiles of a
  //   wgmma kernel there (wgmma_ws with 128-key tiles; wgmma with 64-key tiles at head_dim 256), and
  //   sparser patterns on config()'s 64-row tiles one key block wide: the first is 1.5-2.3 times
  //   faster a score, the second visits fewer scores (docs/attention.md, "Small pattern blocks"); and
  //   with blocks of 16 at head_dim 64 to 128, sparse random patterns on the gathered-key kernel
  //   (path = wgmma_gather), which computes only each query block's own key blocks; with the query
  //   heads of a K/V head together (GQA: its m_tiles) where they share a pattern with one head.
  // Refuses a pattern the spec cannot take (a dense spec, another block size, not the baked one).
  // The first form is for a call with one query head a K/V head.
  AttentionConfig forward_config(const BlockPattern& pattern);
  AttentionConfig forward_config(const BlockPattern& pattern, std::int64_t heads_q, std::int64_t heads_kv);

 private:
  friend struct AttentionInternals;  // the library's own access (src/attention/attention_internals.h)
  // forward, or with launch false prepare_forward.
  void run_forward(const AttentionForwardArgs& args, Stream stream, bool launch);
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot forms: look the kernels up in the process cache on every call.
void attention_forward(const AttentionSpec& spec, const AttentionForwardArgs& args, Stream stream = nullptr);
void attention_backward(const AttentionSpec& spec, const AttentionBackwardArgs& args, Stream stream = nullptr);

// The kernel keys an Attention constructed with this spec and no config loads on a device of `arch`
// ("sm_90a", "sm_80", ...; the default tilings, no tuning database): the forward's, then the
// backward's pre-pass, dK/dV pass, and dQ pass or dQ conversion; on sm_90a a spec without
// `deterministic` adds the three of its deterministic twin, whose dQ pass the backward runs where a
// query row sees few key tiles, and a spec with pattern blocks of 16 or 32 adds last the forward's
// wide tiling, which dense-ish patterns run (Attention::forward_config). For warming a cache without a GPU
// (`sjit compile KEY --arch A`, `sjit demo --compile-only`). A baked spec is refused (its keys need
// the pattern).
std::vector<std::string> attention_kernel_keys(const AttentionSpec& spec, std::string_view arch);

// FLOPs of a forward over what the mask allows: 4 * D * batch * the number of (head, query, key) triples
// the pattern, causality and the sequence ends allow (so a causal dense forward counts about half).
// A bsr or baked spec without args.pattern counts as dense.
double attention_forward_flops(const AttentionSpec& spec, const AttentionForwardArgs& args);

}  // namespace sjit
