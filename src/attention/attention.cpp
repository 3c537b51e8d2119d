// The attention front end: the kernel for each spec, the device copy of each pattern's schedule, the
// launch.
#include "sparsejit/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <mutex>

#include "attention/attention_args.h"
#include "attention/attention_internals.h"
#include "attention/backward_policy.h"
#include "attention/gathered_keys.h"
#include "attention/last_round.h"
#include "attention/packed_queries.h"
#include "attention/tensor_maps.h"
#include "attention/tile_schedule.h"
#include "attention/wide_tiles.h"
#include "codegen/attention_codegen.h"
#include "jit/jit.h"
#include "runtime/context.h"
#include "runtime/driver.h"
#include "sparsejit/error.h"
#include "templates/sparsejit/attention_params.cuh"
#include "tune/attention_tuned_configs.h"

namespace sjit {
namespace {

// A schedule on the device: one buffer holding the four arrays.
struct DeviceSchedule {
  CUcontext context = nullptr;
  std::uint64_t pattern_digest = 0;
  int block_m = 0, block_n = 0;  // the tile shape it was built for
  bool transposed = false;       // key-major (the backward's dK/dV pass)
  DeviceBuffer buffer;
  const int* item_tile_begin = nullptr;
  const int* tile_index = nullptr;
  const unsigned long long* tile_mask = nullptr;
  // The launch order: items heaviest first (query-major), or each head's key tiles heaviest first
  // (key-major: the dK/dV pass keeps a head's CTAs together).
  const int* item_order = nullptr;
  int pattern_heads = 0, q_tiles = 0, items = 0;
  std::int64_t tiles = 0;  // active tiles, all items together
  int item_tiles = 0;      // every item's tiles where all have as many, else 0 (attention::uniform_item_tiles)
  bool in_graph = false;   // a launch captured into a graph reads it: never freed before the Attention
};

// Whether a call's stream is being captured into a CUDA graph, and what its caller should have called
// before the capture began. Capture records launches only, so a call that would first compile,
// allocate or copy is refused, saying what it would have done.
struct Capture {
  bool active = false;
  const char* prepare_call = "";
  void refuse(std::string_view would) const {
    if (active)
      throw InvalidArgument(fmt::format("attention: the stream is being captured into a CUDA graph, but this call "
                                        "would first {}, which a capture cannot record: call Attention::{} "
                                        "before the capture begins", would, prepare_call));
  }
};
Capture capture_of(Stream stream, const char* prepare_call) { return {stream_is_capturing(stream), prepare_call}; }

std::size_t round_up_8(std::size_t bytes) { return (bytes + 7) / 8 * 8; }

// The first entry of a most-recent-first list that `matches`, moved to the front; null if none.
template <class List, class Match>
typename List::value_type* find_recent(List& list, Match matches) {
  const auto it = std::find_if(list.begin(), list.end(), matches);
  if (it == list.end()) return nullptr;
  list.splice(list.begin(), list, it);
  return &list.front();
}

// Threads of a forward CTA: the config's warps, and the copy warpgroup of the persistent kernel.
int forward_threads(const AttentionConfig& config) {
  return 32 * config.warps + (config.path == AttentionPath::wgmma_ws ? 128 : 0);
}

// The warp-specialized kernels move registers between their warpgroups (setmaxnreg) out of the CTA's
// share: compiled for fewer than 65536 / threads a thread, their math warps would wait forever. With
// 256 threads or fewer a thread may have the 255 it can address, and nothing moves.
void require_full_register_share(const jit::LoadedKernel& kernel, int threads) {
  const int full_share = 65536 / threads / 8 * 8;
  if (threads > 256 && kernel.registers != full_share)
    throw Error(fmt::format("attention: the kernel '{}' was compiled for {} registers a thread; its warp "
                            "specialization needs {} (this ptxas allocates differently)",
                            kernel.kernel_key, kernel.registers, full_share));
}

// The mean number of active key tiles (of the dK/dV pass's rows) a query row sees: the active (key
// tile, query row) pairs over the query rows, before the causal cut; from `tiles` of `tile_queries`
// queries over the pattern's heads, or on a key-major schedule (dense: every key tile).
double key_tiles_per_query_row(std::int64_t tiles, int tile_queries, int pattern_heads, std::int64_t seq_q) {
  const double active_rows = double(tiles) * tile_queries / pattern_heads;
  return active_rows / double(std::max<std::int64_t>(seq_q, 1));
}
double active_key_tiles_per_query_row(const DeviceSchedule* key_schedule, std::int64_t key_tiles, std::int64_t seq_q) {
  if (!key_schedule) return double(key_tiles);
  return key_tiles_per_query_row(key_schedule->tiles, key_schedule->block_n, key_schedule->pattern_heads, seq_q);
}

// The keys of a key tile of the dQ pass's schedule (and of its K and V copies): its tiles', or on the
// gathered pass one pattern block (it gathers them 64 keys a step).
int dq_key_rows(const codegen::BackwardTiling& t) { return t.gathered_block > 0 ? t.gathered_block : t.block_cols; }

// The backward's three tilings for `spec` (pass=bwd): the pre-pass, the dK/dV pass (wgmma where sm90
// and the kernel exists), and the dQ pass or, with atomic dQ, the conversion of its accumulator.
struct BackwardTilings {
  codegen::BackwardTiling prep, dkdv, dq;
};
BackwardTilings backward_tilings(const AttentionSpec& bwd, bool sm90) {
  auto tiling = [&](codegen::BackwardPart part) { return codegen::default_backward_tiling(bwd, part, sm90); };
  return {tiling(codegen::BackwardPart::prep), tiling(codegen::BackwardPart::dkdv),
          tiling(codegen::atomic_dq(bwd) ? codegen::BackwardPart::dq_convert : codegen::BackwardPart::dq)};
}

// 10 * major + minor of the device this thread launches on, or 0 without one (the default tiling is
// then the portable mma.sync one).
int current_compute_capability() {
  try {
    const runtime::DeviceFacts& f = runtime::current_device_facts();
    return 10 * f.cc_major + f.cc_minor;
  } catch (...) {
    return 0;
  }
}

// A pattern with every block active runs on the dense kernels (through the dense twin), with the
// checked args less their pattern. (Checked args of an empty problem may have no pattern.)
bool runs_dense_kernels(const AttentionSpec& spec, const BlockPattern* p) {
  return spec.sparsity != Sparsity::dense && p != nullptr &&
         p->nnz() == std::int64_t(p->heads()) * p->block_rows() * p->block_cols();
}
template <class Args>
Args without_pattern(Args a) {
  a.pattern = nullptr;
  return a;
}

std::unique_ptr<DeviceSchedule> upload(const attention::TileSchedule& s, CUcontext context, std::uint64_t digest,
                                       bool transposed) {
  const std::vector<std::int32_t>& order = transposed ? s.head_item_order : s.item_order;
  auto d = std::make_unique<DeviceSchedule>();
  d->context = context;
  d->pattern_digest = digest;
  d->transposed = transposed;
  d->pattern_heads = s.pattern_heads;
  d->q_tiles = s.q_tiles;
  d->items = static_cast<int>(s.item_order.size());
  d->tiles = s.tiles();
  d->item_tiles = attention::uniform_item_tiles(s);
  // Masks first: they need 8-byte alignment.
  const std::size_t mask_bytes = s.tile_mask.size() * 8;
  const std::size_t begin_bytes = s.item_tile_begin.size() * 4, index_bytes = s.tile_index.size() * 4;
  const std::size_t order_bytes = order.size() * 4;
  std::vector<unsigned char> host(round_up_8(mask_bytes) + begin_bytes + index_bytes + order_bytes + 8);
  std::size_t at = 0;
  auto put = [&](const void* src, std::size_t bytes) {
    if (bytes) std::memcpy(host.data() + at, src, bytes);
    const std::size_t offset = at;
    at += bytes;
    return offset;
  };
  const std::size_t mask_at = put(s.tile_mask.data(), mask_bytes);
  at = round_up_8(at);
  const std::size_t begin_at = put(s.item_tile_begin.data(), begin_bytes);
  const std::size_t index_at = put(s.tile_index.data(), index_bytes);
  const std::size_t order_at = put(order.data(), order_bytes);
  d->buffer = DeviceBuffer(host.size());
  d->buffer.upload(host.data(), host.size());
  auto* base = static_cast<unsigned char*>(d->buffer.data());
  d->tile_mask = reinterpret_cast<const unsigned long long*>(base + mask_at);
  d->item_tile_begin = reinterpret_cast<const int*>(base + begin_at);
  d->tile_index = reinterpret_cast<const int*>(base + index_at);
  d->item_order = reinterpret_cast<const int*>(base + order_at);
  return d;
}

}  // namespace

struct Attention::State {
  AttentionSpec spec;
  AttentionConfig config;
  // The path the caller's config named (automatic if none): the dense twin takes the same, and with
  // path=mma the backward's dK/dV pass stays on mma.sync too (otherwise it takes the wgmma kernel on
  // sm_90a wherever one exists).
  AttentionPath asked_path = AttentionPath::automatic;
  std::optional<BlockPattern> baked;
  std::optional<attention::TileSchedule> baked_schedule;
  int baked_item_tiles = 0;  // attention::uniform_item_tiles(*baked_schedule)

  std::mutex mutex;
  std::vector<std::shared_ptr<const jit::LoadedKernel>> kernels;  // one per context
  // The dense kernels of the same head dim, dtype and causality: a pattern with every block active
  // runs there, since the schedule would only add work (measured 4-10% on the H100).
  std::unique_ptr<Attention> dense_twin;
  // Pattern blocks of 16 or 32 with the default tiling: the wide tiling (attention/wide_tiles.h), which
  // a pattern whose blocks fill most of its tiles runs on through a twin on Hopper, and the
  // gathered-key kernel (attention/gathered_keys.h), which sparse random ones run on, with the query
  // heads of a K/V head that share the pattern together where the call has them. Unset (false) where
  // this object makes no such choice (a tiling asked for or tuned, other specs).
  std::optional<AttentionConfig> wide_config;
  bool gathers = false;
  std::unique_ptr<Attention> wide_twin, gathered_twins[3];  // gathered: 1, 2 and 4 query heads a CTA
  // The forward's tiling of each (pattern, query heads a CTA) seen last, most recent first.
  // (gathered: the query heads a CTA, 1, 2 or 4)
  enum class Tiling { narrow, wide, gathered_1, gathered_2, gathered_4 };
  std::list<std::pair<std::uint64_t, Tiling>> tiling_choices;
  // How the backward's dK/dV pass walks the queries of each pattern seen last (contiguous or packed
  // tiles, or gathered: attention/packed_queries.h), the same way; and at d = 64 whether it walks them
  // on 64-query tiles (codegen::narrow_query_backward_tiling).
  std::list<std::pair<std::uint64_t, attention::QueryWalk>> walk_choices;
  std::list<std::pair<std::uint64_t, bool>> narrow_query_choices;
  std::list<std::pair<std::uint64_t, attention::ContiguousWalks>> contiguous_walks_seen;
  // The answer kept in `choices` for `pattern`, or decide()'s, then kept: deciding reads the whole
  // pattern (counting tiles), so it is done once a pattern.
  // `key` names the pattern (its digest, with whatever else the choice depends on).
  template <class Choice, class Decide>
  Choice remembered_choice(std::list<std::pair<std::uint64_t, Choice>>& choices, std::uint64_t key, Decide decide) {
    {
      std::lock_guard lock(mutex);
      if (const auto* known = find_recent(choices, [&](const auto& c) { return c.first == key; }))
        return known->second;
    }
    const Choice choice = decide();
    std::lock_guard lock(mutex);
    choices.emplace_front(key, choice);
    if (choices.size() > kSchedulesKept) choices.pop_back();
    return choice;
  }

  // Small pattern blocks choose their forward's kernel per pattern (forward_tiling): where no tiling
  // is asked for or stored.
  void choose_per_pattern() {
    wide_config = attention::wide_tile_config(spec);
    gathers = attention::gathered_config(spec, 1) || attention::gathered_config(spec, 2);
  }
  // Another Attention this one hands some calls to, made on first use.
  Attention& twin(std::unique_ptr<Attention>& slot, const AttentionSpec& twin_spec, const AttentionConfig& twin_config) {
    std::lock_guard lock(mutex);
    if (!slot) slot = std::make_unique<Attention>(twin_spec, twin_config);
    return *slot;
  }
  Attention& dense() {
    AttentionSpec d = spec;
    d.sparsity = Sparsity::dense;
    AttentionConfig c;  // the device's default tiling for the dense spec, on the path the caller named
    // (wgmma_gather takes patterns only: a full pattern runs the device's dense default)
    c.path = asked_path == AttentionPath::wgmma_gather ? AttentionPath::automatic : asked_path;
    return twin(dense_twin, d, c);
  }
  // The tiling of forward_twin (with its conditions met), kept per (pattern, heads). Heads that share
  // reads are weighed first (they may beat the wide tiles too); where they do not pay, the pattern
  // runs what it runs with one head a CTA (that answer kept, and shared, under its own key).
  // A stored pick (tune_attention, where autotune policy is on or force) comes first, where this
  // object may make it.
  Tiling forward_tiling(const BlockPattern& pattern, int heads) {
    const std::uint64_t key = pattern.digest() ^ (0x9e3779b97f4a7c15ull * std::uint64_t(heads));
    return remembered_choice(tiling_choices, key, [&] {
      if (const auto pick = tuning::tuned_forward_pick(spec, pattern.digest(), heads))
        for (const Tiling t : picks(heads))
          if (pick_name(t) == *pick) return t;
      if (heads > 1)
        return !gathers || !attention::gathering_pays(spec, pattern, config, heads) ? forward_tiling(pattern, 1)
               : heads == 4                                                         ? Tiling::gathered_4
                                                                                    : Tiling::gathered_2;
      if (wide_config && attention::wide_tiles_pay(spec, pattern, config)) return Tiling::wide;
      if (gathers && attention::gathering_pays(spec, pattern, config, 1)) return Tiling::gathered_1;
      return Tiling::narrow;
    });
  }
  // The tilings forward_tiling may pick where a call's gathered kernel could take `heads` query heads
  // a CTA (none where this object does not pick per pattern), and their names as a tuning stores them.
  std::vector<Tiling> picks(int heads) const {
    std::vector<Tiling> out;
    if (!wide_config && !gathers) return out;
    out.push_back(Tiling::narrow);
    if (wide_config) out.push_back(Tiling::wide);
    if (gathers && attention::gathered_config(spec, 1)) out.push_back(Tiling::gathered_1);
    if (gathers && heads > 1 && attention::gathered_config(spec, heads))
      out.push_back(heads == 4 ? Tiling::gathered_4 : Tiling::gathered_2);
    return out;
  }
  static std::string pick_name(Tiling t) {
    if (t == Tiling::narrow) return "narrow";
    if (t == Tiling::wide) return "wide";
    return fmt::format("gathered_heads={}", 1 << (int(t) - int(Tiling::gathered_1)));
  }
  // The twin a forward with `pattern` (not a full one) runs on, on a device that is (`hopper`) or is
  // not compute capability 9.0, where the gathered kernel could take `heads` query heads a CTA
  // (attention::gathered_heads of the call): the wide or a gathered-key tiling's, or none (this
  // object's tiling).
  Attention* forward_twin(const BlockPattern& pattern, bool hopper, int heads) {
    if ((!wide_config && !gathers) || !hopper) return nullptr;
    return twin_of(forward_tiling(pattern, heads));
  }
  Attention* twin_of(Tiling tiling) {
    if (tiling == Tiling::narrow) return nullptr;
    if (tiling == Tiling::wide) return &twin(wide_twin, spec, *wide_config);
    const int slot = int(tiling) - int(Tiling::gathered_1);  // 0, 1, 2: 1, 2, 4 heads
    return &twin(gathered_twins[slot], spec, *attention::gathered_config(spec, 1 << slot));
  }
  // How the 128-key dK/dV pass of tiling `t` would walk `pattern`'s queries, or whether the gathered
  // pass takes it instead (attention/packed_queries.h). (Both ways of summing dQ walk the same tiles
  // where blocks are narrower than them: 128 keys x 64 queries, 128 at d = 64.)
  // `group`: the call's query heads a K/V head (packing a band pays from fewer heads with more);
  // `gathered_sums_by_pass`: whether the gathered pass, if taken, would sum dQ by its dQ pass.
  // `asked`: a walk asked for (the call's, SJIT_BACKWARD_WALK's or a stored tuning's), taken where the
  // pattern can take it; "" leaves it to the rules, whose choice is remembered; without `may_gather`
  // the rules choose between the walks that have query tiles (a call that asked for tiles, no walk).
  struct WalkAsked {
    std::string_view walk;
    bool may_gather = true;
  };
  attention::QueryWalk query_walk(const BlockPattern& pattern, const codegen::BackwardTiling& t, std::int64_t group,
                                  bool gathered_sums_by_pass, WalkAsked asked) {
    // Blocks narrower than the tiles may pack or gather, blocks of 64 on 128-key CTAs may gather.
    const bool narrow_keys = t.wgmma && pattern.block_size() < t.block_rows();
    if (codegen::dkdv_query_runs(spec, t) == 1 && !narrow_keys) return attention::QueryWalk::tiles;
    // (Only specs that gather only with the dQ pass depend on it: one remembered choice for the others.)
    const bool by_pass = gathered_sums_by_pass && attention::gathers_only_with_dq_pass(spec);
    auto choose = [&](std::string_view walk) {
      const bool gathers =
          asked.may_gather && codegen::gathered_backward_tiling(spec, codegen::BackwardPart::dkdv).has_value();
      return attention::choose_query_walk(spec, pattern, t.block_rows(), t.block_cols, group, gathers, by_pass, walk);
    };
    // (A walk forced by name costs nothing to choose; the rules' choice is remembered, with or without
    // the gathered walk.)
    if (!asked.walk.empty() && asked.walk != "auto") return choose(asked.walk);
    const std::uint64_t key = pattern.digest() ^ std::uint64_t(by_pass) ^ (std::uint64_t(t.block_cols) << 32) ^
                              (std::uint64_t(group) << 40) ^ (std::uint64_t(!asked.may_gather) << 62);
    return remembered_choice(walk_choices, key, [&] { return choose(""); });
  }
  // The query rows of the key-major schedule the 128-key dK/dV pass of tiling `t` walks for `pattern`:
  // one pattern block where it packs them into its tiles, else its tiles'. (Where the gathered pass
  // takes the pattern, this schedule still says how many tiles a row sees: packed, the exact count.)
  int key_schedule_cols(const BlockPattern& pattern, const codegen::BackwardTiling& t, std::int64_t group,
                        WalkAsked asked) {
    if (pattern.block_size() >= t.block_cols) return t.block_cols;  // (gathered or not: a block a tile)
    // (How the gathered pass would sum dQ matters to blocks of 64 only.)
    const attention::QueryWalk walk = query_walk(pattern, t, group, false, asked);
    return walk == attention::QueryWalk::tiles ? t.block_cols : pattern.block_size();
  }
  // Device schedules of the patterns seen last, most recent first. A pattern is named by its digest
  // (XXH3-64 over its content) together with the context.
  std::list<std::unique_ptr<DeviceSchedule>> schedules;
  static constexpr std::size_t kSchedulesKept = 16;

  // The caller's args checked against the spec (and the baked pattern, if any), before any GPU work.
  AttentionForwardArgs checked(const AttentionForwardArgs& in) const {
    return attention::checked_forward_args(spec, in, baked ? &*baked : nullptr);
  }
  AttentionBackwardArgs checked(const AttentionBackwardArgs& in) const {
    return attention::checked_backward_args(spec, in, baked ? &*baked : nullptr);
  }
  // Device memory that a graph captured from this object's launches may read after this object has
  // moved on: a schedule dropped from `schedules`, scratch since grown. Freed with the object.
  std::vector<DeviceBuffer> kept_for_graphs;

  const jit::LoadedKernel& kernel(const jit::Target& target, const Capture& capture = {}) {
    {
      std::lock_guard lock(mutex);
      for (const auto& k : kernels)
        if (k->context == target.context) return *k;
    }
    capture.refuse("compile and load its kernel");
    if (on_wgmma(config.path) && target.device->arch != "sm_90a")
      throw InvalidArgument(fmt::format("attention config '{}': path = {} runs on compute capability 9.0 "
                                        "(sm_90a) only; this device is {} ({})",
                                        key(config), name(config.path), target.device->name, target.device->arch));
    auto loaded = jit::get_kernel(target, codegen::attention_kernel_key(spec, config), [&] {
      return codegen::attention_source(spec, config, baked_schedule ? &*baked_schedule : nullptr);
    });
    if (config.path == AttentionPath::wgmma_ws) require_full_register_share(*loaded, forward_threads(config));
    std::lock_guard lock(mutex);
    kernels.push_back(std::move(loaded));
    return *kernels.back();
  }

  const DeviceSchedule& schedule(const BlockPattern& pattern, const jit::Target& target, const Capture& capture = {}) {
    return schedule(pattern, target, config.block_m(), config.block_n, false, capture);
  }

  // The schedule of `pattern` (or of its transpose) for tiles of block_m x block_n, on the device.
  const DeviceSchedule& schedule(const BlockPattern& pattern, const jit::Target& target, int block_m, int block_n,
                                 bool transposed, const Capture& capture = {}) {
    std::lock_guard lock(mutex);
    if (auto* known = find_recent(schedules, [&](const std::unique_ptr<DeviceSchedule>& d) {
          return d->context == target.context && d->pattern_digest == pattern.digest() && d->block_m == block_m &&
                 d->block_n == block_n && d->transposed == transposed;
        })) {
      DeviceSchedule& d = **known;
      d.in_graph = d.in_graph || capture.active;
      return d;
    }
    capture.refuse(fmt::format("build and upload the {} tile schedule of its pattern ({:016x})",
                               transposed ? "key-major" : "query-major", pattern.digest()));
    const attention::TileSchedule s =
        attention::build_tile_schedule(transposed ? pattern.transposed() : pattern, block_m, block_n);
    schedules.push_front(upload(s, target.context, pattern.digest(), transposed));
    schedules.front()->block_m = block_m;
    schedules.front()->block_n = block_n;
    if (schedules.size() > kSchedulesKept) {
      if (schedules.back()->in_graph) kept_for_graphs.push_back(std::move(schedules.back()->buffer));
      schedules.pop_back();
    }
    return *schedules.front();
  }

  // The backward's three kernels in one context for one way of summing dQ (atomic or the dQ pass),
  // and the tilings they were built for (the launch sizes its grids from them).
  struct BackwardKernels {
    CUcontext context;
    bool atomic;
    codegen::BackwardTiling dkdv_tiling, dq_tiling;
    std::shared_ptr<const jit::LoadedKernel> prep, dkdv, dq;  // dq: the dQ pass or dq_convert
  };
  std::vector<BackwardKernels> backward_kernels;
  // Per (context, stream) scratch of the backward: delta and lse2, 8 bytes a query row, and atomic dQ's
  // counters, 4 bytes a (batch, K/V head); and with atomic dQ the fp32 accumulator, 4 * head_dim bytes
  // a query row, in a buffer of its own: zeroed when allocated, every pass leaves it zero (a pass
  // whose launches stopped half-way marks it to be zeroed again before the next).
  struct Scratch {
    CUcontext context;
    Stream stream;
    DeviceBuffer buffer;
    bool zeroed;
    bool stale = false;
    bool in_graph = false;  // a captured launch uses it: kept, not freed, when it grows
  };
  std::list<Scratch> scratch;

  // Whether the backward runs the Hopper kernels on this device.
  bool hopper_backward(const jit::Target& target) const {
    return target.device->arch == "sm_90a" && asked_path != AttentionPath::mma;
  }
  // The spec the backward's kernels are built for: with `atomic` false where the spec would sum dQ
  // atomically, its deterministic twin (the same kernel keys as a spec asking for determinism).
  AttentionSpec backward_spec(bool atomic) const {
    AttentionSpec bwd = spec;
    bwd.pass = Pass::backward;
    if (!atomic && codegen::atomic_dq(bwd)) bwd.deterministic = true;
    return bwd;
  }
  // What the backward of `a` (checked, not a full pattern) runs on `target`: the dK/dV pass's tiling
  // and key-major schedule, which with atomic dQ's tiling says how many tiles a query row sees, and
  // from that, how dQ is summed; then the tiling and schedule of the way chosen (the same keys a CTA).
  // What the dQ rule goes by beyond the group (dq_rule_count, below).
  struct DqRuleCount {
    double tiles_per_row = 0;
    bool banded = false;
  };
  struct BackwardPlan {
    bool sm90 = false;
    codegen::BackwardTiling kv_tiling;
    std::int64_t key_tiles = 0;
    const DeviceSchedule* key_schedule = nullptr;  // null when dense
    double key_tiles_per_row = 0;  // on the schedule walked: packed, the exact count
    // What the dQ rule (and a stored tuning) went by: on the gathered backward the exact count and no
    // band, else dq_rule_count's.
    DqRuleCount dq_rule;
    bool accumulator_spills = false;  // atomic dQ's working set of a K/V group outgrows the L2
    bool atomic = false;
    bool narrow_queries = false;  // d = 64's 64-query dK/dV tiles (codegen::narrow_query_backward_tiling)
  };
  // What the dQ rule goes by beyond the group (attention::choose_dq_summation): the key tiles a query
  // row of `a` sees on the tiles of `plan`'s dK/dV pass, counted as if it walked them contiguous where it
  // packs its queries, and whether those walks make a band (attention::contiguous_walks). The dQ pass
  // walks its own tiles contiguous, so its second S and dP a tile are paid on them, while packing cuts
  // the atomic pass's products and reductions: counted on the packed schedule, windows of blocks of 16
  // at d = 128 (2.35 tiles a row packed, 2.97 contiguous) and causal random blocks of 16 at 0.02 with
  // four query heads a K/V head (9.4 against 28) fell below the thresholds and took the pass, 10-21%
  // and 35-40% slower than atomic dQ (docs/attention.md, "The dQ rule counts contiguous tiles, and
  // bands").
  DqRuleCount dq_rule_count(const AttentionBackwardArgs& a, const BackwardPlan& plan) {
    if (!plan.key_schedule) return {plan.key_tiles_per_row, false};  // dense
    const codegen::BackwardTiling& t = plan.kv_tiling;
    const std::uint64_t key =
        a.pattern->digest() ^ (std::uint64_t(t.block_rows()) << 32) ^ (std::uint64_t(t.block_cols) << 48);
    const attention::ContiguousWalks walks = remembered_choice(contiguous_walks_seen, key, [&] {
      return attention::contiguous_walks(*a.pattern, t.block_rows(), t.block_cols);
    });
    return {key_tiles_per_query_row(walks.tiles, t.block_cols, plan.key_schedule->pattern_heads, a.seq_q),
            walks.banded};
  }
  // What backward(a) runs on `target`: plan_walks's plan, where it is what the call asked for (the walk
  // and the query tiles of its args: what the environment or a tuning asks falls back, silently,
  // to what the pattern can take).
  BackwardPlan plan_backward(const AttentionBackwardArgs& a, const jit::Target& target, const Capture& capture = {}) {
    BackwardPlan plan = plan_walks(a, target, capture);
    if (!a.walk && a.query_tile_cols == 0) return plan;
    const bool gathered = plan.kv_tiling.gathered_block > 0;
    const BackwardWalk ran = walk_of(plan);
    const std::string runs =
        a.pattern == nullptr ? "without a pattern (or with every block active: the dense kernels) it walks tiles"
                             : fmt::format("with pattern blocks of {} on dK/dV tiles of {} keys x {} queries it walks {}",
                                           a.pattern->block_size(), plan.kv_tiling.block_rows(),
                                           plan.kv_tiling.block_cols, name(ran));
    if (a.walk && *a.walk != ran)
      throw InvalidArgument(fmt::format(
          "attention backward: walk = {} asked, but {} ('{}'): packing needs pattern blocks narrower than the "
          "query tiles, gathering blocks of 16, 32 or 64 narrower than the keys, on Hopper (sm_90a){}",
          name(*a.walk), runs, key(spec), *a.walk == BackwardWalk::gathered ? " and not at every head_dim" : ""));
    if (a.query_tile_cols != 0 && gathered)
      throw InvalidArgument(fmt::format("attention backward: query_tile_cols = {} asked, but the gathered walk has no "
                                        "query tiles to choose (it steps a pattern block of queries at a time): "
                                        "leave it 0",
                                        a.query_tile_cols));
    if (a.query_tile_cols != 0 && a.query_tile_cols != plan.kv_tiling.block_cols)
      throw InvalidArgument(fmt::format(
          "attention backward: query_tile_cols = {} asked, but {} ('{}'); only head_dim 64 with pattern blocks of 16 "
          "or 32 on Hopper (sm_90a) chooses between 64 and 128",
          a.query_tile_cols, runs, key(spec)));
    return plan;
  }
  static BackwardWalk walk_of(const BackwardPlan& plan) {
    if (plan.kv_tiling.gathered_block > 0) return BackwardWalk::gathered;
    // A packed walk's key-major schedule lists runs of one pattern block, not the pass's tiles.
    const bool packed = plan.key_schedule && plan.key_schedule->block_n < plan.kv_tiling.block_cols;
    return packed ? BackwardWalk::packed : BackwardWalk::tiles;
  }
  // The plan of plan_backward, with what each choice asks for taken where the pattern can take it.
  BackwardPlan plan_walks(const AttentionBackwardArgs& a, const jit::Target& target, const Capture& capture) {
    const std::string_view forced_walk = attention::forced_query_walk();  // a bad one refused on every backward
    const std::optional<int> forced_cols = attention::forced_query_tile_cols();  // (as the walk's)
    BackwardPlan plan;
    plan.sm90 = hopper_backward(target);
    // The dK/dV pass's tiling for a way of summing dQ: at d = 64 with pattern blocks of 16 or 32 its
    // 64-query tiles where the pattern's walks are short (attention/packed_queries.h), else the default.
    const bool patterned = spec.sparsity != Sparsity::dense && a.seq_q > 0 && a.seq_k > 0;
    const std::int64_t group = a.heads_q / std::max<std::int64_t>(a.heads_kv, 1);
    const std::optional<codegen::BackwardTiling> narrow =
        patterned && plan.sm90 ? codegen::narrow_query_backward_tiling(backward_spec(true)) : std::nullopt;
    // The walk and its query tiles asked for, first to last: by the call, by the environment, by a
    // tuning stored for this pattern (tune_backward_walk, with its way of summing dQ; read only where
    // neither of the others asks, and the autotune policy is on or force).
    const bool environment_walks = !forced_walk.empty() && forced_walk != "auto";
    const bool asked_elsewhere = a.walk || a.query_tile_cols != 0 || environment_walks || forced_cols.has_value();
    const std::optional<tuning::TunedWalk> tuned_walk =
        patterned && plan.sm90 && !asked_elsewhere
            ? tuning::tuned_backward_walk(backward_spec(true), a.pattern->digest(), group)
            : std::nullopt;
    // (Query tiles asked by the call without a walk: the rules choose between the walks that have them.)
    const bool tiles_asked_alone = !a.walk && a.query_tile_cols != 0 && !environment_walks;
    const WalkAsked walk_asked{a.walk ? name(*a.walk) : tuned_walk ? name(tuned_walk->walk)
                                                     : tiles_asked_alone ? std::string_view() : forced_walk,
                               !tiles_asked_alone};
    const std::optional<int> cols_asked = a.query_tile_cols != 0 ? std::optional<int>(a.query_tile_cols)
                                          : tuned_walk && tuned_walk->query_tile_cols != 0
                                              ? std::optional<int>(tuned_walk->query_tile_cols)
                                              : forced_cols;
    auto narrow_pays = [&] {
      return remembered_choice(narrow_query_choices, a.pattern->digest() ^ (std::uint64_t(group) << 40), [&] {
        return attention::narrow_query_tiles_pay(*a.pattern, narrow->block_rows(), group);  // (its keys: the default's)
      });
    };
    const bool narrow_queries = narrow && (cols_asked ? *cols_asked == 64 : narrow_pays());
    auto dkdv_tiling = [&](bool atomic) {
      if (!narrow_queries) return backward_tilings(backward_spec(atomic), plan.sm90).dkdv;
      return atomic ? *narrow : *codegen::narrow_query_backward_tiling(backward_spec(false));
    };
    plan.kv_tiling = dkdv_tiling(true);
    plan.narrow_queries = narrow_queries;
    plan.key_tiles = (a.seq_k + plan.kv_tiling.block_rows() - 1) / plan.kv_tiling.block_rows();
    if (patterned) {
      plan.key_schedule =
          &schedule(*a.pattern, target, plan.kv_tiling.block_rows(), key_schedule_cols(*a.pattern, plan.kv_tiling, group, walk_asked),
                    true, capture);
      // The kernels rank a group's CTAs by the schedule's key tiles (key_tile_owner). The pattern's
      // shape (checked against the lengths) gives it ceil(Sk / block_rows) of them, or one more where
      // its blocks are wider than a CTA's keys: the last block's second half may lie past Sk, and its
      // CTA walks nothing.
      const std::int64_t tiles = plan.key_schedule->q_tiles;
      const bool wide_blocks = a.pattern->block_size() > plan.kv_tiling.block_rows();
      if (tiles != plan.key_tiles && !(wide_blocks && tiles == plan.key_tiles + 1))
        throw Error(fmt::format("attention backward: the pattern's key-major schedule has {} key tiles where "
                                "Sk = {} needs {}", tiles, a.seq_k, plan.key_tiles));
      plan.key_tiles = tiles;
    }
    plan.key_tiles_per_row = active_key_tiles_per_query_row(plan.key_schedule, plan.key_tiles, a.seq_q);
    const DqRuleCount contiguous = dq_rule_count(a, plan);
    auto rule_count = [&](bool gathered) { return gathered ? DqRuleCount{plan.key_tiles_per_row, false} : contiguous; };
    plan.accumulator_spills = attention::accumulator_spills(group, a.seq_q, spec.head_dim, target.device->l2_bytes);
    // How dQ is summed, on the gathered backward or not. A stored tuning (nullopt at once with the
    // autotune policy off; remembered per process otherwise) decides only where nothing before it in
    // choose_dq_summation does; the gathered backward's, those of d = 64's 64-query tiles and those of
    // an accumulator beyond the L2 are stored apart.
    const std::optional<DqSummation> walk_tuned_dq =
        tuned_walk ? std::optional<DqSummation>(tuned_walk->dq) : std::nullopt;
    auto summation = [&](bool gathered) {
      const DqRuleCount count = rule_count(gathered);
      const std::optional<DqSummation> tuned =
          walk_tuned_dq ? walk_tuned_dq
                        : tuning::tuned_dq_summation(backward_spec(true), group, count.tiles_per_row,
                                                     {.gathered = gathered,
                                                      .beyond_l2 = plan.accumulator_spills,
                                                      .narrow_queries = narrow_queries && !gathered,
                                                      .banded = count.banded});
      return attention::choose_dq_summation(spec, plan.sm90, count.tiles_per_row, group,
                                            attention::forced_dq_summation(), a.dq_summation, tuned, gathered,
                                            plan.accumulator_spills ? plan.key_tiles : 0,
                                            target.device->memory_bandwidth, plan.kv_tiling.block_cols, count.banded);
    };
    // Blocks of 16, 32 or 64 that the gathered backward takes (a block a CTA in both passes), which sums
    // dQ by a rule of its own (for blocks of 64 at d = 128 also a reason to take it or not).
    const bool narrow_keys = plan.key_schedule && a.pattern->block_size() < plan.kv_tiling.block_rows();
    const DqSummation if_gathered = narrow_keys ? summation(true) : DqSummation::atomic;
    bool gathered = narrow_keys && query_walk(*a.pattern, plan.kv_tiling, group, if_gathered == DqSummation::pass,
                                              walk_asked) == attention::QueryWalk::gathered;
    const DqSummation way = gathered ? if_gathered : summation(false);
    // Where the 128-key passes' way is the dQ pass (asked, tuned or their rule), blocks of 64 at d = 128
    // gather after all: the gathered dQ pass is the faster pass there.
    if (!gathered && narrow_keys && way == DqSummation::pass && attention::gathers_only_with_dq_pass(spec))
      gathered = query_walk(*a.pattern, plan.kv_tiling, group, true, walk_asked) == attention::QueryWalk::gathered;
    plan.atomic = way == DqSummation::atomic;
    plan.dq_rule = rule_count(gathered);
    if (gathered) {
      plan.kv_tiling = *codegen::gathered_backward_tiling(backward_spec(plan.atomic), codegen::BackwardPart::dkdv);
      plan.narrow_queries = false;
      const int block = a.pattern->block_size();
      plan.key_schedule = &schedule(*a.pattern, target, block, block, true, capture);
      plan.key_tiles = plan.key_schedule->q_tiles;
      return plan;
    }
    // Without atomic dQ the dK/dV pass's tiling may differ (its kernel is the deterministic one): the
    // same key tiles, its own schedule.
    if (!plan.atomic) {
      const codegen::BackwardTiling pass_tiling = dkdv_tiling(false);
      if (pass_tiling.block_rows() != plan.kv_tiling.block_rows())
        throw Error("attention backward: internal: the dK/dV tilings of both ways of summing dQ differ in keys");
      if (plan.key_schedule && pass_tiling != plan.kv_tiling)
        plan.key_schedule = &schedule(*a.pattern, target, pass_tiling.block_rows(),
                                      key_schedule_cols(*a.pattern, pass_tiling, group, walk_asked), true, capture);
      plan.kv_tiling = pass_tiling;
    }
    return plan;
  }
  // plan_backward for the args of a call (checked), on the dense kernels' State where backward() would
  // run them (a pattern with every block active). Launches nothing.
  BackwardPlan plan_of_call(const AttentionBackwardArgs& in) {
    const AttentionBackwardArgs a = checked(in);
    if (runs_dense_kernels(spec, a.pattern)) return dense().state_->plan_of_call(without_pattern(a));
    return plan_backward(a, jit::current_target());
  }

  // `dkdv`: the plan's dK/dV tiling (a pattern's choice: the default, 64-query tiles at d = 64, or the
  // gathered-query pass).
  const BackwardKernels& backward(const jit::Target& target, bool atomic, const codegen::BackwardTiling& dkdv,
                                  const Capture& capture = {}) {
    {
      std::lock_guard lock(mutex);
      for (const auto& k : backward_kernels)
        if (k.context == target.context && k.atomic == atomic && k.dkdv_tiling == dkdv) return k;
    }
    const bool gathered = dkdv.gathered_block > 0;
    capture.refuse(fmt::format("compile and load its backward kernels ({} dQ, {})", atomic ? "atomic" : "pass",
                               key(dkdv)));
    const AttentionSpec bwd = backward_spec(atomic);
    auto get = [&](const codegen::BackwardTiling& t) {
      return jit::get_kernel(target, key(bwd) + "|" + key(t), [&] { return codegen::attention_backward_source(bwd, t); });
    };
    BackwardTilings t = backward_tilings(bwd, hopper_backward(target));
    t.dkdv = dkdv;
    // Without atomic dQ the gathered backward's dQ pass gathers the key blocks of each query block.
    if (gathered && !atomic) t.dq = *codegen::gathered_backward_tiling(bwd, codegen::BackwardPart::dq);
    BackwardKernels k{target.context, atomic, t.dkdv, t.dq};
    k.prep = get(t.prep);
    k.dkdv = get(t.dkdv);
    if (t.dkdv.wgmma) require_full_register_share(*k.dkdv, t.dkdv.threads());
    k.dq = get(t.dq);
    if (t.dq.wgmma) require_full_register_share(*k.dq, t.dq.threads());
    std::lock_guard lock(mutex);
    backward_kernels.push_back(std::move(k));
    return backward_kernels.back();
  }

  // `zeroed`: the accumulator's buffer, filled with zeros when (re)allocated.
  // With `optional`, null instead of refusing where a capture would have to allocate or grow it.
  float* scratch_for(const jit::Target& target, Stream stream, std::size_t bytes, bool zeroed, const Capture& capture,
                     bool optional = false) {
    std::lock_guard lock(mutex);
    auto it = std::find_if(scratch.begin(), scratch.end(), [&](const Scratch& s) {
      return s.context == target.context && s.stream == stream && s.zeroed == zeroed;
    });
    if (optional && capture.active && (it == scratch.end() || it->buffer.bytes() < bytes)) return nullptr;
    if (it == scratch.end()) {
      capture.refuse(fmt::format("allocate {} bytes of scratch for the stream", bytes));
      it = scratch.insert(scratch.end(), {target.context, stream, DeviceBuffer(bytes), zeroed, zeroed});
    } else if (it->buffer.bytes() < bytes) {
      capture.refuse(fmt::format("grow the stream's scratch from {} to {} bytes", it->buffer.bytes(), bytes));
      if (it->in_graph) kept_for_graphs.push_back(std::move(it->buffer));
      else synchronize(stream);  // the old buffer may still be in use by work queued on this stream
      it->buffer = DeviceBuffer(bytes);
      it->stale = zeroed;
      it->in_graph = false;
    }
    if (it->stale) it->buffer.fill_bytes(0, stream);  // under capture, a step of the graph
    it->stale = false;
    it->in_graph = it->in_graph || capture.active;
    return it->buffer.as<float>();
  }

  // Everything a backward of `a` (checked, not a full pattern) on `stream` uses besides its launches:
  // the plan, the kernels of its way of summing dQ, the dQ pass's query-major schedule, and the
  // stream's scratch. Built or allocated on first use, which `capture` refuses.
  struct BackwardResources {
    BackwardPlan plan;
    const BackwardKernels* kernels = nullptr;
    const DeviceSchedule* query_schedule = nullptr;  // the dQ pass's, with a pattern
    float* stats = nullptr;     // delta and lse2 (a float each a query row), then the groups' counters
    float* dq_accum = nullptr;  // atomic dQ's accumulator
  };
  BackwardResources backward_resources(const AttentionBackwardArgs& a, const jit::Target& target, Stream stream,
                                       const Capture& capture) {
    BackwardResources r;
    r.plan = plan_backward(a, target, capture);
    r.kernels = &backward(target, r.plan.atomic, r.plan.kv_tiling, capture);
    if (r.kernels->dkdv_tiling != r.plan.kv_tiling)
      throw Error(fmt::format("attention backward: internal: the dK/dV kernel was built for '{}', the schedule for '{}'",
                              key(r.kernels->dkdv_tiling), key(r.plan.kv_tiling)));
    const codegen::BackwardTiling& q_tiling = r.kernels->dq_tiling;
    if (r.plan.key_schedule && !r.plan.atomic)  // the query-major pass walks the forward's schedule
      r.query_schedule = &schedule(*a.pattern, target, q_tiling.block_rows(), dq_key_rows(q_tiling), false, capture);
    const std::size_t rows = std::size_t(std::max<std::int64_t>(a.batch * a.heads_q * a.seq_q, 1));
    r.stats = scratch_for(target, stream, rows * 8 + std::size_t(a.batch * a.heads_kv) * 4, false, capture);
    if (r.plan.atomic) r.dq_accum = scratch_for(target, stream, rows * std::size_t(spec.head_dim) * 4, true, capture);
    return r;
  }

  // The zeroed scratch of (context, stream) may hold partial sums: zero it before its next use.
  void mark_zeroed_scratch_stale(const jit::Target& target, Stream stream) {
    std::lock_guard lock(mutex);
    for (Scratch& s : scratch)
      if (s.context == target.context && s.stream == stream && s.zeroed) s.stale = true;
  }
};

Attention::Attention(const AttentionSpec& spec, const AttentionConfig& config) : state_(std::make_unique<State>()) {
  state_->spec = canonical(spec);
  if (state_->spec.sparsity == Sparsity::baked)
    throw InvalidArgument(fmt::format("attention: '{}' is baked: construct Attention with the BlockPattern to bake",
                                      key(state_->spec)));
  state_->spec.pass = Pass::forward;  // one object runs both passes
  state_->asked_path = config.path;
  const AttentionConfig tuned = tuning::attention_config_for(state_->spec, config);
  state_->config = resolve(state_->spec, tuned, current_compute_capability());
  // With no tiling asked for or stored, small pattern blocks choose their kernel per pattern.
  if (tuned == AttentionConfig{}) state_->choose_per_pattern();
}

Attention::Attention(const AttentionSpec& spec, const BlockPattern& pattern, const AttentionConfig& config)
    : state_(std::make_unique<State>()) {
  AttentionSpec s = spec;
  s.sparsity = Sparsity::baked;
  if (s.block_size == 0) s.block_size = pattern.block_size();
  s.pattern_digest = pattern.digest();
  state_->spec = canonical(s);
  state_->spec.pass = Pass::forward;
  state_->asked_path = config.path;
  if (pattern.block_size() != state_->spec.block_size)
    throw InvalidArgument(fmt::format("attention: the pattern to bake has block size {} but the spec says {}",
                                      pattern.block_size(), state_->spec.block_size));
  state_->config = resolve(state_->spec, tuning::attention_config_for(state_->spec, config), current_compute_capability());
  state_->baked = pattern;
  state_->baked_schedule =
      attention::build_tile_schedule(pattern, state_->config.block_m(), state_->config.block_n);
  state_->baked_item_tiles = attention::uniform_item_tiles(*state_->baked_schedule);
  constexpr std::int64_t kMaxBakedTiles = 1 << 20;
  if (state_->baked_schedule->tiles() > kMaxBakedTiles)
    throw InvalidArgument(fmt::format("attention: the pattern to bake has {} active tiles; baking more than {} would "
                                      "make a huge kernel: use sparsity=bsr", state_->baked_schedule->tiles(),
                                      kMaxBakedTiles));
}

Attention::~Attention() = default;
Attention::Attention(Attention&&) noexcept = default;
Attention& Attention::operator=(Attention&&) noexcept = default;

const AttentionSpec& Attention::spec() const { return state_->spec; }
AttentionConfig Attention::config() const { return state_->config; }

void Attention::prepare() { state_->kernel(jit::current_target()); }

void Attention::prepare(const BlockPattern& pattern) {
  attention::check_pattern_fits_spec(state_->spec, pattern);
  if (runs_dense_kernels(state_->spec, &pattern)) return state_->dense().prepare();  // as forward() runs it
  const jit::Target target = jit::current_target();
  const bool hopper = target.device->arch == "sm_90a";
  // Every tiling a forward with this pattern may run: the heads a call has decide between the
  // gathered kernel's (1, 2 or 4 a CTA; more than 1 only with a pattern shared by every head).
  bool own_tiling = false;
  for (const int heads : {1, 2, 4}) {
    if (heads > 1 && !attention::heads_may_share(state_->spec, pattern, heads)) continue;
    if (Attention* twin = state_->forward_twin(pattern, hopper, heads)) twin->prepare(pattern);
    else own_tiling = true;
  }
  if (!own_tiling) return;
  state_->kernel(target);
  if (state_->spec.sparsity == Sparsity::block_sparse) state_->schedule(pattern, target);
}

AttentionConfig Attention::forward_config(const BlockPattern& pattern) { return forward_config(pattern, 1, 1); }

AttentionConfig Attention::forward_config(const BlockPattern& pattern, std::int64_t heads_q, std::int64_t heads_kv) {
  attention::check_pattern_fits_spec(state_->spec, pattern);
  if (state_->baked && !(pattern == *state_->baked))
    throw InvalidArgument(fmt::format("attention: the pattern given (digest {:016x}) is not the one baked into the "
                                      "kernel ({:016x})", pattern.digest(), state_->baked->digest()));
  if (runs_dense_kernels(state_->spec, &pattern)) return state_->dense().config();
  const int heads = attention::gathered_heads(state_->spec, pattern, heads_q, heads_kv);
  if (Attention* twin = state_->forward_twin(pattern, current_compute_capability() == 90, heads)) return twin->config();
  return state_->config;
}

void Attention::prepare_backward(const AttentionBackwardArgs& in, Stream stream) {
  const AttentionBackwardArgs a = state_->checked(in);
  if (a.batch == 0 || (a.seq_q == 0 && a.seq_k == 0)) return;
  if (runs_dense_kernels(state_->spec, a.pattern)) return state_->dense().prepare_backward(without_pattern(a), stream);
  state_->backward_resources(a, jit::current_target(), stream, {});
}

void Attention::forward(const AttentionForwardArgs& args, Stream stream) { run_forward(args, stream, true); }

void Attention::prepare_forward(const AttentionForwardArgs& args, Stream stream) { run_forward(args, stream, false); }

void Attention::run_forward(const AttentionForwardArgs& in, Stream stream, bool launch) {
  const AttentionSpec& spec = state_->spec;
  const AttentionConfig& config = state_->config;
  const AttentionForwardArgs a = state_->checked(in);
  if (a.batch == 0 || a.seq_q == 0) return;
  if (runs_dense_kernels(spec, a.pattern)) return state_->dense().run_forward(without_pattern(a), stream, launch);
  // The gathered-key kernel with several query heads a CTA reads each key block once for all of
  // them: they must share the pattern and a K/V head.
  if (config.path == AttentionPath::wgmma_gather && config.m_tiles > 1) {
    const int pattern_heads = spec.sparsity == Sparsity::baked ? state_->baked->heads() : a.pattern->heads();
    const std::int64_t group = a.heads_q / a.heads_kv;
    if (pattern_heads != 1 || group % config.m_tiles != 0)
      throw InvalidArgument(fmt::format(
          "attention config '{}': mt = {} takes {} query heads a CTA, which must share the pattern and a K/V "
          "head; here the pattern has {} heads (1 is needed) and a K/V head has {} query heads (a multiple of {} "
          "is needed): use mt = 1",
          key(config), config.m_tiles, config.m_tiles, pattern_heads, group, config.m_tiles));
  }
  const jit::Target target = jit::current_target();
  if (spec.sparsity == Sparsity::block_sparse)
    if (Attention* twin = state_->forward_twin(*a.pattern, target.device->arch == "sm_90a",
                                               attention::gathered_heads(spec, *a.pattern, a.heads_q, a.heads_kv)))
      return twin->run_forward(a, stream, launch);

  // A dense twin's caller holds the block-sparse object, whose prepare(pattern) readies the twin.
  const Capture capture = capture_of(stream, "prepare_forward(args, stream) or prepare(pattern) (prepare() for a dense spec)");
  const jit::LoadedKernel& kernel = state_->kernel(target, capture);
  sjit_kernels::AttentionForwardParams p{};
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.o = a.o;
  p.lse = a.lse;
  p.q_batch_stride = a.q_strides.batch, p.q_head_stride = a.q_strides.head, p.q_row_stride = a.q_strides.row;
  p.k_batch_stride = a.k_strides.batch, p.k_head_stride = a.k_strides.head, p.k_row_stride = a.k_strides.row;
  p.v_batch_stride = a.v_strides.batch, p.v_head_stride = a.v_strides.head, p.v_row_stride = a.v_strides.row;
  p.o_batch_stride = a.o_strides.batch, p.o_head_stride = a.o_strides.head, p.o_row_stride = a.o_strides.row;
  p.batch = int(a.batch), p.heads_q = int(a.heads_q), p.heads_kv = int(a.heads_kv);
  p.seq_q = int(a.seq_q), p.seq_k = int(a.seq_k);
  p.scale_log2 = a.scale * 1.4426950408889634f;

  std::int64_t grid = 0;
  const std::int64_t key_tiles = (a.seq_k + config.block_n - 1) / config.block_n;
  std::int64_t item_tiles = 0;  // every item's key tiles where all have as many (without causality)
  if (spec.sparsity == Sparsity::dense) {
    const std::int64_t q_tiles = (a.seq_q + config.block_m() - 1) / config.block_m();
    grid = q_tiles * a.batch * a.heads_q;
    item_tiles = key_tiles;
  } else if (spec.sparsity == Sparsity::block_sparse) {
    const DeviceSchedule& s = state_->schedule(*a.pattern, target, capture);
    p.item_tile_begin = s.item_tile_begin;
    p.tile_index = s.tile_index;
    p.tile_mask = s.tile_mask;
    p.item_order = s.item_order;
    p.pattern_heads = s.pattern_heads;
    p.q_tiles = s.q_tiles;
    grid = std::int64_t(s.items) * a.batch * (a.heads_q / s.pattern_heads);
    item_tiles = s.item_tiles;
  } else {
    const attention::TileSchedule& s = *state_->baked_schedule;
    grid = std::int64_t(s.item_order.size()) * a.batch * (a.heads_q / s.pattern_heads);
    item_tiles = state_->baked_item_tiles;
  }
  if (spec.causal != Causal::none) item_tiles = 0;
  if (grid > 0x7fffffff)
    throw InvalidArgument(fmt::format("attention: {} query tiles in all exceed the 2^31 - 1 blocks of a launch", grid));
  if (config.path == AttentionPath::wgmma_gather) grid /= config.m_tiles;  // query heads a CTA (checked above)
  if (grid == 0) return;
  p.work_items = int(grid);
  // The persistent kernel: one CTA an SM (its shared memory and registers allow no more), each taking
  // one work item a round of gridDim.x, snaking, and a share of the last round's items where that
  // round is split (attention_forward_sm90_ws.cuh).
  if (config.path == AttentionPath::wgmma_ws) {
    // Automatic: only items of one length (dense, or a pattern with as many tiles in every row, not
    // causal). Where they differ the rounds before the last are uneven too, which an even split of
    // the last cannot mend (dense causal lost 5% split), and short items lose to the merge.
    const attention::LastRoundSplit split = attention::split_last_round(
        grid, item_tiles > 0 ? item_tiles : key_tiles, item_tiles > 0, target.device->multiprocessors, a.last_round);
    grid = std::min<std::int64_t>(grid, target.device->multiprocessors);
    if (split.tail_items > 0) {
      // Two scratch buffers of the stream: the pieces' partials, and the items' counters (zeroed).
      // Under a capture, where an earlier call on the stream (prepare_forward) has not allocated them,
      // the kernel takes every item whole instead.
      float* partials = state_->scratch_for(
          target, stream,
          attention::last_round_scratch_bytes(split.grid, config.block_m(), codegen::wgmma_tile_dim(spec.head_dim)),
          false, capture, true);
      float* counters = state_->scratch_for(target, stream, std::size_t(split.tail_items) * 4, true,
                                            capture, true);
      if (partials != nullptr && counters != nullptr) {
        grid = split.grid;
        p.tail_items = split.tail_items;
        p.tail_ctas = split.tail_ctas;
        p.tail_partials = partials;
        p.tail_counters = reinterpret_cast<unsigned*>(counters);
      }
    }
  }
  if (!launch) return;
  // The Hopper kernels' second parameter: the tensor maps they load their tiles through. The mma.sync
  // kernel has one parameter, and the driver reads only the parameters a kernel declares.
  sjit_kernels::AttentionForwardTensorMaps maps{};
  if (on_wgmma(config.path))
    maps = attention::forward_tensor_maps(a, spec.dtype, spec.head_dim, config.block_m(), config.block_n,
                                          config.path == AttentionPath::wgmma_ws ||
                                              config.path == AttentionPath::wgmma_gather);
  void* params[] = {&p, &maps};
  jit::launch(kernel, unsigned(grid), unsigned(forward_threads(config)), reinterpret_cast<CUstream>(stream), params);
}

void Attention::backward(const AttentionBackwardArgs& in, Stream stream) {
  const AttentionSpec& spec = state_->spec;
  const AttentionBackwardArgs a = state_->checked(in);
  if (a.batch == 0 || (a.seq_q == 0 && a.seq_k == 0)) return;
  if (runs_dense_kernels(spec, a.pattern)) return state_->dense().backward(without_pattern(a), stream);

  const jit::Target target = jit::current_target();
  const State::BackwardResources r =
      state_->backward_resources(a, target, stream, capture_of(stream, "prepare_backward(args, stream)"));
  const State::BackwardPlan& plan = r.plan;
  const codegen::BackwardTiling& kv_tiling = plan.kv_tiling;
  const std::int64_t key_tiles = plan.key_tiles;
  const DeviceSchedule* key_schedule = plan.key_schedule;
  const bool atomic = plan.atomic;
  const State::BackwardKernels& kernels = *r.kernels;
  const codegen::BackwardTiling& q_tiling = kernels.dq_tiling;

  const std::int64_t rows = a.batch * a.heads_q * a.seq_q;
  const std::int64_t groups = a.batch * a.heads_kv;  // (batch, K/V head): a dK/dV CTA's query heads
  sjit_kernels::AttentionBackwardParams p{};
  p.q = a.q, p.k = a.k, p.v = a.v, p.o = a.o, p.d_o = a.d_o, p.lse = a.lse;
  p.dq_accum = r.dq_accum;
  p.delta = r.stats;
  p.lse2 = p.delta + rows;
  p.groups_done = reinterpret_cast<unsigned*>(p.lse2 + rows);
  p.dq = a.dq, p.dk = a.dk, p.dv = a.dv;
  auto strides = [](const Strides& s, long long& b, long long& h, long long& r) { b = s.batch, h = s.head, r = s.row; };
  strides(a.q_strides, p.q_batch_stride, p.q_head_stride, p.q_row_stride);
  strides(a.k_strides, p.k_batch_stride, p.k_head_stride, p.k_row_stride);
  strides(a.v_strides, p.v_batch_stride, p.v_head_stride, p.v_row_stride);
  strides(a.o_strides, p.o_batch_stride, p.o_head_stride, p.o_row_stride);
  strides(a.do_strides, p.do_batch_stride, p.do_head_stride, p.do_row_stride);
  strides(a.dq_strides, p.dq_batch_stride, p.dq_head_stride, p.dq_row_stride);
  strides(a.dk_strides, p.dk_batch_stride, p.dk_head_stride, p.dk_row_stride);
  strides(a.dv_strides, p.dv_batch_stride, p.dv_head_stride, p.dv_row_stride);
  p.batch = int(a.batch), p.heads_q = int(a.heads_q), p.heads_kv = int(a.heads_kv);
  p.seq_q = int(a.seq_q), p.seq_k = int(a.seq_k);
  p.scale = a.scale;
  p.scale_log2 = a.scale * 1.4426950408889634f;

  std::int64_t kv_grid = key_tiles * groups;
  // The groups a wave of CTAs spans, and one more: how many groups later a group's dQ is converted
  // (below), and the last groups whose CTAs take turns (key_tile_owner), so the grid ends on light ones.
  const std::int64_t wave_groups =
      key_tiles > 0 ? std::min(groups, (target.device->multiprocessors + key_tiles - 1) / key_tiles + 1) : 1;
  p.tail_groups = int(wave_groups);
  // Atomic dQ: the Hopper dK/dV pass converts each group's rows in the CTAs a wave later (about as many
  // groups later as a wave of one CTA an SM holds), and dq_convert the rest; after the mma.sync pass,
  // or where the CTAs have too little work to hide it, dq_convert converts them all (a lag of every
  // group converts none in the pass).
  p.convert_lag = int(groups);
  // (The gathered-query pass has no conversion warps.)
  if (atomic && kv_tiling.wgmma && kv_tiling.gathered_block == 0 && kv_grid > 0 &&
      attention::worth_converting_in_pass(plan.key_tiles_per_row))
    p.convert_lag = int(wave_groups);
  const std::int64_t converted_in_pass = groups - p.convert_lag;
  p.convert_row0 = converted_in_pass * (a.heads_q / a.heads_kv) * a.seq_q;
  // The dQ pass's grid, or with atomic dQ the conversion's.
  const int per_row_cta_rows = sjit_kernels::per_row_cta_rows(spec.head_dim);
  std::int64_t q_grid = atomic ? (rows - p.convert_row0 + per_row_cta_rows - 1) / per_row_cta_rows
                               : (a.seq_q + q_tiling.block_rows() - 1) / q_tiling.block_rows() * a.batch * a.heads_q;
  if (key_schedule) {
    const DeviceSchedule& ks = *key_schedule;
    p.k_item_tile_begin = ks.item_tile_begin, p.k_tile_index = ks.tile_index, p.k_tile_mask = ks.tile_mask;
    p.k_item_order = ks.item_order, p.k_items_per_head = ks.q_tiles, p.k_query_rows = ks.block_n;
    p.pattern_heads = ks.pattern_heads;
    if (r.query_schedule) {  // the query-major pass walks the forward's schedule
      const DeviceSchedule& qs = *r.query_schedule;
      p.q_item_tile_begin = qs.item_tile_begin, p.q_tile_index = qs.tile_index, p.q_tile_mask = qs.tile_mask;
      p.q_item_order = qs.item_order, p.q_items_per_head = qs.q_tiles;
      q_grid = std::int64_t(qs.items) * a.batch * (a.heads_q / qs.pattern_heads);
    }
  }
  if (kv_grid > 0x7fffffff || q_grid > 0x7fffffff)
    throw InvalidArgument("attention backward: the problem needs more than 2^31 - 1 blocks in one launch");
  // The Hopper dK/dV kernel's second parameter: the tensor maps it loads its tiles through. The other
  // kernels have one parameter, and the driver reads only the parameters a kernel declares.
  sjit_kernels::AttentionBackwardTensorMaps maps{};
  if (kv_grid > 0 && kv_tiling.wgmma)
    maps = attention::backward_tensor_maps(a, spec.dtype, spec.head_dim, kv_tiling.block_rows(), kv_tiling.block_cols,
                                           p.dq_accum, key_schedule ? key_schedule->block_n : kv_tiling.block_cols);
  // The Hopper dQ pass's: K and V in boxes of its key tile's rows, Q and dO of its query tile's.
  sjit_kernels::AttentionBackwardTensorMaps dq_maps{};
  if (q_grid > 0 && q_tiling.wgmma)
    dq_maps = attention::backward_tensor_maps(a, spec.dtype, spec.head_dim, dq_key_rows(q_tiling), q_tiling.block_rows(),
                                              nullptr, q_tiling.block_rows());
  void* params[] = {&p, &maps};
  void* dq_params[] = {&p, &dq_maps};
  const auto cu_stream = reinterpret_cast<CUstream>(stream);
  if (rows > 0) {
    jit::launch(*kernels.prep, unsigned((rows + per_row_cta_rows - 1) / per_row_cta_rows), 256, cu_stream, params);
  } else if (atomic && kv_grid > 0) {
    // No query row, so no pre-pass to reset the groups' counters, which the dK/dV CTAs still count
    // themselves in and wait on (found by compute-sanitizer's initcheck: they added to whatever the
    // stream's scratch held, and a count that wrapped would have waited forever).
    SJIT_CU(runtime::driver().cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(p.groups_done), 0,
                                              std::size_t(groups) * sizeof(unsigned), cu_stream));
  }
  try {
    if (kv_grid > 0) jit::launch(*kernels.dkdv, unsigned(kv_grid), unsigned(kv_tiling.threads()), cu_stream, params);
    if (q_grid > 0)  // the dQ pass, or dq_convert (256 threads)
      jit::launch(*kernels.dq, unsigned(q_grid), atomic ? 256u : unsigned(q_tiling.threads()), cu_stream, dq_params);
  } catch (...) {
    if (atomic) state_->mark_zeroed_scratch_stale(target, stream);  // the adds may have run, unconverted
    throw;
  }
}

DqSummation Attention::dq_summation(const AttentionBackwardArgs& in) {
  return state_->plan_of_call(in).atomic ? DqSummation::atomic : DqSummation::pass;
}

AttentionInternals::ForwardPicks AttentionInternals::forward_picks(const AttentionSpec& spec, const BlockPattern& pattern,
                                                                  std::int64_t heads_q, std::int64_t heads_kv) {
  // An explicit config would keep the database out but also the choice per pattern: take the default
  // one and undo whatever a stored tiling put in its place.
  Attention attention(spec);
  Attention::State& s = *attention.state_;
  s.config = resolve(s.spec, {}, current_compute_capability());
  s.choose_per_pattern();
  ForwardPicks out;
  out.untuned = attention.forward_config(pattern, heads_q, heads_kv);
  out.heads = attention::gathered_heads(s.spec, pattern, heads_q, heads_kv);
  if (current_compute_capability() != 90 || runs_dense_kernels(s.spec, &pattern)) return out;
  for (const auto tiling : s.picks(out.heads)) {
    const Attention* twin = s.twin_of(tiling);
    out.picks.emplace_back(Attention::State::pick_name(tiling), twin ? twin->config() : s.config);
  }
  return out;
}

AttentionInternals::BackwardChoices AttentionInternals::backward_choices(Attention& attention,
                                                                         const AttentionBackwardArgs& in) {
  const auto plan = attention.state_->plan_of_call(in);
  const BackwardWalk walk = Attention::State::walk_of(plan);
  return {walk,
          plan.atomic ? DqSummation::atomic : DqSummation::pass,
          codegen::key(plan.kv_tiling),
          walk == BackwardWalk::gathered ? 0 : plan.kv_tiling.block_cols,
          plan.dq_rule.tiles_per_row,
          plan.accumulator_spills,
          plan.narrow_queries,
          plan.dq_rule.banded};
}

std::string Attention::backward_tiling(const AttentionBackwardArgs& in) {
  return codegen::key(state_->plan_of_call(in).kv_tiling);
}

BackwardWalk Attention::backward_walk(const AttentionBackwardArgs& in) {
  return State::walk_of(state_->plan_of_call(in));
}

std::string_view name(DqSummation s) { return s == DqSummation::atomic ? "atomic" : "pass"; }

std::string_view name(BackwardWalk w) {
  return w == BackwardWalk::gathered ? "gathered" : w == BackwardWalk::packed ? "packed" : "tiles";
}

std::string_view name(LastRound mode) {
  return mode == LastRound::whole ? "whole" : mode == LastRound::split ? "split" : "auto";
}

LastRound parse_last_round(std::string_view text) {
  for (const LastRound mode : {LastRound::automatic, LastRound::whole, LastRound::split})
    if (text == name(mode)) return mode;
  throw InvalidArgument(fmt::format("last round '{}' is unknown: use auto, whole or split", text));
}

void attention_backward(const AttentionSpec& spec, const AttentionBackwardArgs& args, Stream stream) {
  Attention(spec).backward(args, stream);
}

void attention_forward(const AttentionSpec& spec, const AttentionForwardArgs& args, Stream stream) {
  Attention(spec).forward(args, stream);  // the kernel itself comes from the process-wide cache
}

std::vector<std::string> attention_kernel_keys(const AttentionSpec& in, std::string_view arch) {
  AttentionSpec spec = canonical(in);
  if (spec.sparsity == Sparsity::baked)
    throw InvalidArgument(fmt::format("attention_kernel_keys: '{}' is baked: its kernel keys name the pattern's "
                                      "digest and are made by an Attention built from the BlockPattern", key(spec)));
  int cc = 0;  // "sm_90a" -> 90
  for (const char c : arch.substr(arch.starts_with("sm_") ? 3 : arch.size()))
    if (c >= '0' && c <= '9') cc = 10 * cc + (c - '0');
  if (!arch.starts_with("sm_") || cc < 80)
    throw InvalidArgument(fmt::format("attention_kernel_keys: arch '{}': use sm_80 or later, e.g. sm_90a", arch));
  // Only sm_90a has the wgmma kernels (sm_90 without the arch-specific features does not).
  const bool sm90 = arch == "sm_90a";
  spec.pass = Pass::forward;
  std::vector<std::string> keys = {codegen::attention_kernel_key(spec, resolve(spec, {}, sm90 ? 90 : 80))};
  AttentionSpec bwd = spec;
  bwd.pass = Pass::backward;
  auto add_backward_keys = [&] {
    const BackwardTilings t = backward_tilings(bwd, sm90);
    for (const codegen::BackwardTiling& tiling : {t.prep, t.dkdv, t.dq}) keys.push_back(key(bwd) + "|" + key(tiling));
    // Pattern blocks of 16, 32 and 64: the gathered backward that sparse random patterns run on (its dQ
    // pass where dQ is not summed atomically; blocks of 64 at d = 128 run it only that way).
    if (!sm90) return;
    const bool atomic = codegen::atomic_dq(bwd);
    if (atomic && attention::gathers_only_with_dq_pass(bwd)) return;
    for (const codegen::BackwardPart part : {codegen::BackwardPart::dkdv, codegen::BackwardPart::dq})
      if (const auto gathered = codegen::gathered_backward_tiling(bwd, part))
        if (part == codegen::BackwardPart::dkdv || !atomic) keys.push_back(key(bwd) + "|" + key(*gathered));
    // d = 64 with blocks of 16 or 32: the 64-query dK/dV tiles that patterns with short walks run on.
    if (const auto narrow = codegen::narrow_query_backward_tiling(bwd)) keys.push_back(key(bwd) + "|" + key(*narrow));
  };
  add_backward_keys();
  // On Hopper a backward that may sum dQ either way runs the dQ pass where a row sees few tiles
  // (choose_dq_summation): its deterministic twin's kernels too.
  if (sm90 && codegen::atomic_dq(bwd)) {
    bwd.deterministic = true;
    add_backward_keys();
  }
  // Small pattern blocks: the wide tiling that dense-ish patterns run on, and for blocks of 16 the
  // gathered-key kernel that sparse random ones run on (Attention::forward_config).
  const std::optional<AttentionConfig> per_pattern[] = {
      attention::wide_tile_config(spec), attention::gathered_config(spec, 1), attention::gathered_config(spec, 2),
      attention::gathered_config(spec, 4)};
  for (const std::optional<AttentionConfig>& other : per_pattern)
    if (sm90 && other) keys.push_back(codegen::attention_kernel_key(spec, resolve(spec, *other, 90)));
  return keys;
}

double attention_forward_flops(const AttentionSpec& in, const AttentionForwardArgs& args) {
  const AttentionSpec spec = canonical(in);
  const double per_pair = 4.0 * spec.head_dim * double(args.batch);
  const std::int64_t sq = args.seq_q, sk = args.seq_k;
  const std::int64_t offset = spec.causal == Causal::bottom_right ? sk - sq : 0;
  // Keys row i sees within keys [k0, k1) under causality.
  auto keys_seen = [&](std::int64_t i, std::int64_t k0, std::int64_t k1) -> std::int64_t {
    if (spec.causal == Causal::none) return k1 - k0;
    return std::clamp<std::int64_t>(i + offset + 1, k0, k1) - k0;
  };
  if (spec.sparsity == Sparsity::dense || args.pattern == nullptr) {
    double pairs = 0;
    for (std::int64_t i = 0; i < sq; ++i) pairs += double(keys_seen(i, 0, sk));
    return per_pair * double(args.heads_q) * pairs;
  }
  const BlockPattern& pattern = *args.pattern;
  const int bs = pattern.block_size();
  double pairs = 0;
  for (std::int64_t h = 0; h < args.heads_q; ++h) {
    const int ph = pattern.heads() == 1 ? 0 : int(h);
    if (pattern.heads() == 1 && h > 0) {
      pairs *= double(args.heads_q);
      break;
    }
    for (std::int64_t r = 0; r < pattern.block_rows(); ++r)
      for (const std::int32_t c : pattern.row(ph, r)) {
        const std::int64_t k0 = std::int64_t(c) * bs, k1 = std::min<std::int64_t>(k0 + bs, sk);
        for (std::int64_t i = r * bs; i < std::min<std::int64_t>((r + 1) * bs, sq); ++i) pairs += double(keys_seen(i, k0, k1));
      }
  }
  return per_pair * pairs;
}

}  // namespace sjit
