#include "codegen/attention_codegen.h"

#include <fmt/format.h>

#include "codegen/cuda_names.h"

#include "sparsejit/error.h"

namespace sjit::codegen {
namespace {

int causal_id(Causal causal) {  // sjit_kernels::CausalMode
  switch (causal) {
    case Causal::none: return 0;
    case Causal::top_left: return 1;
    case Causal::bottom_right: return 2;
  }
  return -1;
}

int sparsity_id(Sparsity sparsity) {  // sjit_kernels::SparsityMode
  switch (sparsity) {
    case Sparsity::dense: return 0;
    case Sparsity::block_sparse: return 1;
    case Sparsity::baked: return 2;
  }
  return -1;
}

template <class Int>
std::string array_literal(std::string_view type, std::string_view name, const std::vector<Int>& values,
                          std::string_view suffix = "") {
  std::string text = fmt::format("__device__ const {} {}[{}] = {{", type, name, std::max<std::size_t>(values.size(), 1));
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i % 16 == 0) text += "\n ";
    text += fmt::format(" {}{},", values[i], suffix);
  }
  if (values.empty()) text += "0";
  text += "\n};\n";
  return text;
}

}  // namespace

std::string attention_kernel_key(const AttentionSpec& spec, const AttentionConfig& config) {
  AttentionSpec forward = spec;
  forward.deterministic = false;  // a backward option: one forward kernel serves both settings
  return key(forward) + "|" + key(config);
}

int attention_forward_shared_bytes(const AttentionSpec& spec, const AttentionConfig& config) {
  const int tile_rows = config.block_m() + 2 * config.stages * config.block_n;  // Q, and K and V of each slot
  const int tile_dim = wgmma_tile_dim(spec.head_dim);
  const int tiles_bytes = tile_rows * tile_dim * 2;
  if (config.path == AttentionPath::wgmma) {
    // Unpadded 128-byte-swizzled tiles and the copies' mbarriers (Q's and one per ring slot), plus 1 KB
    // to align the base to a swizzle atom (AttentionSm90Layout in attention_forward_sm90.cuh).
    return 1024 + tiles_bytes + 8 * (config.stages + 1);
  }
  if (config.path == AttentionPath::wgmma_gather) {
    // Q of one pattern block a query head (m_tiles heads), two slots each of K and V of 64 gathered
    // keys, two P^T tiles of a 128-byte row a query, the column exchange (2 x 4 floats a query), five
    // copy barriers, and 1 KB for alignment (GatherLayout in attention_forward_sm90_gather.cuh).
    const int rows = config.block_m() * config.m_tiles;
    return 1024 + rows * tile_dim * 2 + 4 * 64 * tile_dim * 2 + 2 * rows * 128 + 2 * 4 * rows * 4 + 8 * 5;
  }
  if (config.path == AttentionPath::wgmma_ws) {
    // The same tiles with a second Q buffer, the records of the two items (24 bytes each) and of the
    // ring's tiles (16 bytes each), and a full and an empty mbarrier for each Q buffer and for K and V
    // of each ring slot (AttentionWsLayout in attention_forward_sm90_ws.cuh).
    return 1024 + tiles_bytes + config.block_m() * tile_dim * 2 + 2 * 24 + 16 * config.stages +
           8 * (4 + 4 * config.stages);
  }
  const int row_bytes = (spec.head_dim + 8) * 2;  // padded rows of 16-bit elements
  return tile_rows * row_bytes;
}

KernelSource attention_source(const AttentionSpec& spec, const AttentionConfig& config,
                              const attention::TileSchedule* baked) {
  if (spec.pass != Pass::forward)
    throw InvalidSpec(fmt::format("attention: pass={} has no kernel yet: only the forward pass is implemented",
                                  name(spec.pass)));
  const bool is_baked = spec.sparsity == Sparsity::baked;
  if (is_baked && baked == nullptr)
    throw InvalidSpec(fmt::format("attention: '{}' is baked: its kernel can only be built from the pattern itself "
                                  "(construct sjit::Attention with the BlockPattern)", key(spec)));
  // The template each path instantiates.
  const char* kernel = config.path == AttentionPath::wgmma          ? "attention_forward_sm90"
                       : config.path == AttentionPath::wgmma_ws     ? "attention_forward_sm90_ws"
                       : config.path == AttentionPath::wgmma_gather ? "attention_forward_sm90_gather"
                                                                    : "attention_forward";
  KernelSource out;
  out.kernel_key = attention_kernel_key(spec, config);
  std::string arrays, baked_members;
  if (is_baked) {
    arrays = "\n// The baked pattern's tile schedule (see attention/tile_schedule.h).\n" +
             array_literal("int", "sjit_item_tile_begin", baked->item_tile_begin) +
             array_literal("int", "sjit_tile_index", baked->tile_index) +
             array_literal("unsigned long long", "sjit_tile_mask", baked->tile_mask, "ull") +
             array_literal("int", "sjit_item_order", baked->item_order);
    baked_members = fmt::format(
        "  static constexpr int pattern_heads = {};\n"
        "  static constexpr int q_tiles = {};\n"
        "  __device__ static const int* item_tile_begin() {{ return sjit_item_tile_begin; }}\n"
        "  __device__ static const int* tile_index() {{ return sjit_tile_index; }}\n"
        "  __device__ static const unsigned long long* tile_mask() {{ return sjit_tile_mask; }}\n"
        "  __device__ static const int* item_order() {{ return sjit_item_order; }}\n",
        baked->pattern_heads, baked->q_tiles);
  }
  out.source = fmt::format(
      "// {}\n"
      "#include \"sparsejit/{}.cuh\"\n"
      "{}\n"
      "struct Cfg {{\n"
      "  using T = {};\n"
      "  static constexpr int head_dim = {};\n"
      "  static constexpr int warps = {};\n"
      "  static constexpr int m_tiles = {};\n"
      "  static constexpr int block_m = {};\n"
      "  static constexpr int block_n = {};\n"
      "  static constexpr int stages = {};\n"
      "  static constexpr bool q_in_registers = {};\n"
      "  static constexpr int causal = {};  // {}\n"
      "  static constexpr int sparsity = {};  // {}\n"
      "  static constexpr int pattern_block = {};\n"
      "{}"
      "}};\n",
      out.kernel_key, kernel, arrays, cuda_type(spec.dtype), spec.head_dim, config.warps,
      config.m_tiles, config.block_m(), config.block_n, config.stages, config.q_in_registers == 1 ? "true" : "false",
      causal_id(spec.causal), name(spec.causal), sparsity_id(spec.sparsity), name(spec.sparsity),
      // Dense kernels: one "block" larger than any tile, so no tile is ever split into groups.
      spec.sparsity == Sparsity::dense ? 1 << 20 : spec.block_size, baked_members);
  out.source_name = fmt::format("{}.cu", kernel);
  out.name_expression = fmt::format("sjit_kernels::{}<Cfg>", kernel);
  out.dynamic_shared_bytes = attention_forward_shared_bytes(spec, config);
  return out;
}

}  // namespace sjit::codegen
