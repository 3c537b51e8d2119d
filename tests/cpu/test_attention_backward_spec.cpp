// Attention backward on the host side: the deterministic option in the spec's key text, which dQ
// summation each spec gets, the generated units of the backward parts, and their NVRTC compiles.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "codegen/attention_codegen.h"
#include "sparsejit/sparsejit.h"

using namespace sjit;
using Catch::Matchers::Contains;
using Catch::Matchers::EndsWith;

namespace {

AttentionSpec backward_spec(int head_dim, bool deterministic) {
  AttentionSpec s;
  s.head_dim = head_dim;
  s.pass = Pass::backward;
  s.deterministic = deterministic;
  return s;
}

}  // namespace

TEST_CASE("the deterministic option: key text, default, round trip and refusals", "[attention][backward][spec]") {
  CHECK_FALSE(AttentionSpec{}.deterministic);  // atomic dQ unless asked
  CHECK(key(backward_spec(128, true)) == "attention:d=128,dtype=bf16,causal=none,sparsity=dense,pass=bwd,det=1");
  CHECK(key(backward_spec(128, false)) == "attention:d=128,dtype=bf16,causal=none,sparsity=dense,pass=bwd");
  CHECK(parse_attention("attention:d=128,pass=bwd,det=1") == backward_spec(128, true));
  CHECK(parse_attention("attention:d=128,pass=bwd,det=0") == backward_spec(128, false));
  CHECK(parse_attention("attention:d=128,pass=bwd") == backward_spec(128, false));

  AttentionSpec baked = backward_spec(64, true);
  baked.sparsity = Sparsity::baked;
  baked.block_size = 64;
  baked.pattern_digest = 0x0123456789abcdefull;
  CHECK(key(baked) == "attention:d=64,dtype=bf16,causal=none,sparsity=baked,block=64,pass=bwd,det=1,"
                      "pattern=0123456789abcdef");
  CHECK(parse_attention(key(baked)) == baked);

  for (const char* bad : {"2", "yes", "true"}) {
    CAPTURE(bad);
    const std::string text = std::string("attention:d=64,det=") + bad;
    CHECK_THROWS_AS(parse_attention(text), InvalidSpec);
    CHECK_THROWS_WITH(parse_attention(text), Contains("det") && Contains("use 1"));
  }
}

TEST_CASE("one forward kernel serves both settings of the backward option", "[attention][backward][codegen]") {
  const AttentionConfig config = resolve(AttentionSpec{}, {});
  AttentionSpec det = AttentionSpec{};
  det.deterministic = true;
  CHECK(codegen::attention_kernel_key(det, config) == codegen::attention_kernel_key(AttentionSpec{}, config));
  CHECK_THAT(codegen::attention_kernel_key(det, config), !Contains("det="));
}

TEST_CASE("which specs sum dQ with atomics, and what their units say", "[attention][backward][codegen]") {
  for (const int d : {32, 64, 96, 128}) {
    CAPTURE(d);
    CHECK(codegen::atomic_dq(backward_spec(d, false)));
    CHECK_FALSE(codegen::atomic_dq(backward_spec(d, true)));
  }
  // d = 256 keeps the deterministic dQ pass: the dK/dV accumulators leave no registers for it.
  CHECK_FALSE(codegen::atomic_dq(backward_spec(256, false)));

  using codegen::BackwardPart;
  const AttentionSpec atomic = backward_spec(128, false), det = backward_spec(128, true);
  const codegen::BackwardTiling dkdv = codegen::default_backward_tiling(atomic, BackwardPart::dkdv);
  CHECK_THAT(codegen::attention_backward_source(atomic, dkdv).source, Contains("atomic_dq = true;"));
  CHECK_THAT(codegen::attention_backward_source(det, dkdv).source, Contains("atomic_dq = false;"));
  // The dS^T tile: block_rows x (block_cols + 8) 16-bit elements more shared memory.
  CHECK(codegen::attention_backward_shared_bytes(atomic, dkdv) - codegen::attention_backward_shared_bytes(det, dkdv) ==
        dkdv.block_rows() * (dkdv.block_cols + 8) * 2);
  codegen::BackwardTiling convert = dkdv;
  convert.part = BackwardPart::dq_convert;
  CHECK(codegen::attention_backward_source(atomic, convert).name_expression ==
        "sjit_kernels::attention_backward_dq_convert<Cfg>");
  CHECK(codegen::parse_backward_tiling(codegen::key(convert)).part == BackwardPart::dq_convert);

  // Atomic dQ splits a query tile's 16-row mma tiles over the warps: 4 warps cannot cover 128 columns.
  codegen::BackwardTiling narrow = dkdv;
  narrow.warps = 4;
  narrow.block_cols = 128;
  CHECK_THROWS_WITH(codegen::attention_backward_source(atomic, narrow), Contains("warps (4)") && Contains("cols / 16 (8)"));
  CHECK_NOTHROW(codegen::attention_backward_source(det, narrow));
}

TEST_CASE("the backward kernels of both modes compile with NVRTC without spills at d = 64",
          "[attention][backward][codegen][nvrtc]") {
  const CacheSettings saved = cache_settings();
  set_cache_settings({saved.dir, CacheMode::off, saved.max_bytes});
  const std::string spec = "attention:d=64,dtype=f16,causal=tl,sparsity=bsr,block=64,pass=bwd";
  // And the gathered backward of pattern blocks of 16 (sm_90a), both ways of summing dQ.
  const std::string small = "attention:d=64,dtype=bf16,causal=br,sparsity=bsr,block=16,pass=bwd";
  const std::vector<std::string> keys = {
      spec + "|part=prep,warps=8,cols=64,stages=2",      spec + "|part=dkdv,warps=8,cols=64,stages=2",
      spec + "|part=dq_convert,warps=8,cols=64,stages=2", spec + ",det=1|part=dkdv,warps=8,cols=64,stages=2",
      spec + ",det=1|part=dq,warps=4,cols=64,stages=2",
      small + "|part=dkdv,warps=4,cols=64,stages=2,path=wgmma_gather,block=16",
      small + ",det=1|part=dkdv,warps=4,cols=64,stages=2,path=wgmma_gather,block=16",
      small + ",det=1|part=dq,warps=4,cols=64,stages=2,path=wgmma_gather,block=16",
  };
  // Two at a time: CI has two cores.
  for (std::size_t first = 0; first < keys.size(); first += 2) {
    std::vector<std::future<CompiledKernel>> compiled;
    for (std::size_t i = first; i < std::min(first + 2, keys.size()); ++i)
      compiled.push_back(std::async(std::launch::async, [k = keys[i]] { return compile_key(k, "sm_90a"); }));
    for (std::size_t n = 0; n < compiled.size(); ++n) {
      CAPTURE(keys[first + n]);
      const CompiledKernel k = compiled[n].get();
      CHECK(k.binary.compare(0, 4, "\x7f" "ELF") == 0);
      CHECK(k.usage.registers > 0);
      CHECK(k.usage.spill_store_bytes == 0);
    }
  }
  set_cache_settings(saved);
}

TEST_CASE("the Hopper dK/dV and dQ tilings: key text, defaults, refusals", "[attention][backward][codegen]") {
  using codegen::BackwardPart;
  const AttentionSpec spec = backward_spec(128, false);
  const codegen::BackwardTiling hopper = codegen::default_backward_tiling(spec, BackwardPart::dkdv, true);
  CHECK(hopper.wgmma);
  CHECK(codegen::key(hopper) == "part=dkdv,warps=8,cols=64,stages=2,path=wgmma");
  CHECK(codegen::parse_backward_tiling(codegen::key(hopper)).wgmma);
  CHECK_FALSE(codegen::parse_backward_tiling("part=dkdv,warps=8,cols=64,stages=2").wgmma);
  CHECK_FALSE(codegen::default_backward_tiling(spec, BackwardPart::dkdv, false).wgmma);  // not sm_90a
  // The deterministic dQ pass has a Hopper kernel of 8 warps; the per-row kernels have none.
  const codegen::BackwardTiling hopper_dq = codegen::default_backward_tiling(spec, BackwardPart::dq, true);
  CHECK(hopper_dq.wgmma);
  CHECK(codegen::key(hopper_dq) == "part=dq,warps=8,cols=128,stages=2,path=wgmma");
  CHECK(hopper_dq.threads() == 256);  // no helper warpgroup
  // 128-key tiles at d = 128, dense or with pattern blocks of 128; 64 at d = 64, with narrower
  // pattern blocks, and off Hopper.
  AttentionSpec narrow_blocks = spec;
  narrow_blocks.sparsity = Sparsity::block_sparse;
  for (const int block : {16, 32, 64, 128}) {
    narrow_blocks.block_size = block;
    CAPTURE(block);
    CHECK(codegen::default_backward_tiling(narrow_blocks, BackwardPart::dq, true).block_cols == (block == 128 ? 128 : 64));
  }
  CHECK(codegen::default_backward_tiling(backward_spec(64, true), BackwardPart::dq, true).block_cols == 64);
  CHECK(codegen::default_backward_tiling(backward_spec(96, true), BackwardPart::dq, true).block_cols == 128);
  CHECK(codegen::default_backward_tiling(spec, BackwardPart::dq, false).block_cols == 64);
  CHECK(codegen::default_backward_tiling(spec, BackwardPart::dkdv, true).block_cols == 64);
  // The d = 64 dK/dV pass walks 128-query tiles on Hopper, with or without atomic dQ, dense or with
  // pattern blocks of 16, 32 or 128 or more; with blocks of 64, or off Hopper, 64. Blocks of 16 and 32
  // also have 64-query tiles, for patterns whose walks are short; no other spec has.
  AttentionSpec d64 = backward_spec(64, true);
  CHECK(codegen::default_backward_tiling(d64, BackwardPart::dkdv, true).block_cols == 128);
  CHECK(codegen::default_backward_tiling(d64, BackwardPart::dkdv, false).block_cols == 64);
  CHECK(codegen::default_backward_tiling(backward_spec(64, false), BackwardPart::dkdv, true).block_cols == 128);
  CHECK(codegen::default_backward_tiling(backward_spec(64, false), BackwardPart::dkdv, false).block_cols == 64);
  d64.sparsity = Sparsity::block_sparse;
  for (const int block : {16, 32, 64, 128, 256}) {
    d64.block_size = block;
    CAPTURE(block);
    const codegen::BackwardTiling wide = codegen::default_backward_tiling(d64, BackwardPart::dkdv, true);
    CHECK(wide.block_cols == (block == 64 ? 64 : 128));
    CHECK(codegen::dkdv_query_runs(d64, wide) == (block < 64 ? 128 / block : 1));
    const std::optional<codegen::BackwardTiling> narrow = codegen::narrow_query_backward_tiling(d64);
    REQUIRE(narrow.has_value() == (block == 16 || block == 32));
    if (!narrow) continue;
    CHECK(codegen::key(*narrow) == "part=dkdv,warps=8,cols=64,stages=2,path=wgmma");
    CHECK(codegen::dkdv_query_runs(d64, *narrow) == 64 / block);
  }
  for (const int d : {96, 128, 256}) {
    AttentionSpec other = backward_spec(d, true);
    other.sparsity = Sparsity::block_sparse;
    other.block_size = 16;
    CAPTURE(d);
    CHECK_FALSE(codegen::narrow_query_backward_tiling(other).has_value());
  }
  CHECK_FALSE(codegen::narrow_query_backward_tiling(backward_spec(64, true)).has_value());  // dense
  CHECK(codegen::parse_backward_tiling("part=dkdv,warps=8,cols=128,stages=2,path=wgmma").block_cols == 128);
  CHECK(codegen::parse_backward_tiling("part=dq,warps=8,cols=64,stages=2,path=wgmma").block_cols == 64);
  CHECK(codegen::default_backward_tiling(spec, BackwardPart::dq, false).warps == 4);
  CHECK_FALSE(codegen::default_backward_tiling(spec, BackwardPart::dq, false).wgmma);
  CHECK_FALSE(codegen::default_backward_tiling(spec, BackwardPart::dq_convert, true).wgmma);
  CHECK_FALSE(codegen::default_backward_tiling(spec, BackwardPart::prep, true).wgmma);
  CHECK_THAT(codegen::attention_backward_source(backward_spec(128, true), hopper_dq).source,
             Contains("attention_backward_dq_sm90.cuh"));
  CHECK(codegen::attention_backward_source(backward_spec(128, true), hopper_dq).name_expression ==
        "sjit_kernels::attention_backward_dq_sm90<Cfg>");
  // d = 64 takes the wgmma kernel too (measured faster since dQ goes out by bulk reductions), and
  // d = 96 (its tiles padded to 128 columns); 32 has none.
  for (const int d : {64, 96}) {
    CAPTURE(d);
    CHECK(codegen::default_backward_tiling(backward_spec(d, false), BackwardPart::dkdv, true).wgmma);
    CHECK(codegen::default_backward_tiling(backward_spec(d, true), BackwardPart::dq, true).wgmma);
  }
  CHECK_FALSE(codegen::default_backward_tiling(backward_spec(32, false), BackwardPart::dkdv, true).wgmma);
  CHECK_FALSE(codegen::default_backward_tiling(backward_spec(32, true), BackwardPart::dq, true).wgmma);
  // d = 256: the Hopper kernels with 64 rows a CTA (their two math warpgroups on half the dims each;
  // the dK/dV pass's third warpgroup for copies); off Hopper mma.sync with 32-column tiles.
  const codegen::BackwardTiling dkdv256 = codegen::default_backward_tiling(backward_spec(256, false), BackwardPart::dkdv, true);
  CHECK(codegen::key(dkdv256) == "part=dkdv,warps=4,cols=64,stages=2,path=wgmma");
  CHECK(dkdv256.block_rows() == 64);
  CHECK(dkdv256.threads() == 384);
  CHECK(codegen::attention_backward_source(backward_spec(256, false), dkdv256).dynamic_shared_bytes <= 232448);
  const codegen::BackwardTiling dq256 = codegen::default_backward_tiling(backward_spec(256, true), BackwardPart::dq, true);
  CHECK(codegen::key(dq256) == "part=dq,warps=4,cols=64,stages=2,path=wgmma");
  CHECK(dq256.block_rows() == 64);
  CHECK(dq256.threads() == 384);  // and a warpgroup for the copies
  CHECK(codegen::attention_backward_source(backward_spec(256, true), dq256).dynamic_shared_bytes <= 232448);
  CHECK(codegen::default_backward_tiling(backward_spec(256, false), BackwardPart::dkdv, false).block_cols == 32);
  CHECK(codegen::default_backward_tiling(backward_spec(256, true), BackwardPart::dq, false).block_cols == 32);
  CHECK(codegen::default_backward_tiling(backward_spec(128, true), BackwardPart::dkdv, true).wgmma);
  CHECK_THAT(codegen::attention_backward_source(spec, hopper).source, Contains("attention_backward_sm90.cuh"));
  CHECK(codegen::attention_backward_source(spec, hopper).name_expression == "sjit_kernels::attention_backward_dkdv_sm90<Cfg>");

  CHECK_THROWS_WITH(codegen::parse_backward_tiling("part=dq,warps=4,cols=128,stages=2,path=wgmma"),
                    Contains("part=dkdv with warps=8 (or 4 at head_dim 256) and cols=64") &&
                        Contains("part=dq with warps=8 and cols=64 or 128 (or warps=4 and cols=64 at head_dim 256)"));
  CHECK_THROWS_WITH(codegen::parse_backward_tiling("part=dkdv,warps=8,cols=32,stages=2,path=wgmma"),
                    Contains("'part=dkdv,warps=8,cols=32,stages=2,path=wgmma'"));
  // 128-query dK/dV tiles: only at d = 64, with or without atomic dQ, in the shared memory a block has.
  const codegen::BackwardTiling wide_dkdv = codegen::parse_backward_tiling("part=dkdv,warps=8,cols=128,stages=2,path=wgmma");
  CHECK_NOTHROW(codegen::attention_backward_source(backward_spec(64, true), wide_dkdv));
  CHECK(codegen::attention_backward_source(backward_spec(64, false), wide_dkdv).dynamic_shared_bytes <= 232448);
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(128, true), wide_dkdv),
                    Contains("cols=128 only at head_dim 64") && Contains("not at head_dim 128"));
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(96, false), wide_dkdv),
                    Contains("not at head_dim 96"));
  CHECK_THROWS_WITH(codegen::parse_backward_tiling("part=dq,warps=8,cols=32,stages=2,path=wgmma"), Contains("cols=64 or 128"));
  // 128-key tiles in three slots need more shared memory than a block has at d = 128, not at d = 64.
  const codegen::BackwardTiling deep_dq = codegen::parse_backward_tiling("part=dq,warps=8,cols=128,stages=3,path=wgmma");
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(128, true), deep_dq),
                    Contains("head_dim 128 needs") && Contains("more than the 232448"));
  CHECK_NOTHROW(codegen::attention_backward_source(backward_spec(64, true), deep_dq));
  CHECK_THROWS_WITH(codegen::parse_backward_tiling("part=prep,path=wgmma"), Contains("part=prep"));
  CHECK_THROWS_WITH(codegen::parse_backward_tiling("part=dkdv,path=tma"), Contains("'tma'") && Contains("mma or wgmma"));
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(32, false), hopper),
                    Contains("head_dim 64, 96, 128 or 256, not 32"));
  // The Hopper kernels' row warps: 8 (128 rows) up to d = 128, 4 (64 rows) at d = 256.
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(256, false), hopper),
                    Contains("takes warps=4 at head_dim 256, not 8"));
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(256, true), hopper_dq),
                    Contains("takes warps=4 at head_dim 256, not 8"));
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(128, false), dkdv256),
                    Contains("takes warps=8 at head_dim 128, not 4"));
  CHECK_THROWS_WITH(codegen::attention_backward_source(backward_spec(64, true), dq256),
                    Contains("takes warps=8 at head_dim 64, not 4"));
  // d = 96's swizzled tiles take the shared memory of d = 128's.
  CHECK(codegen::attention_backward_source(backward_spec(96, false), hopper).dynamic_shared_bytes ==
        codegen::attention_backward_source(backward_spec(128, false), hopper).dynamic_shared_bytes);
  CHECK(codegen::attention_backward_source(backward_spec(96, true), hopper_dq).dynamic_shared_bytes ==
        codegen::attention_backward_source(backward_spec(128, true), hopper_dq).dynamic_shared_bytes);
}

TEST_CASE("the Hopper dK/dV pass packs query blocks narrower than its tiles into runs", "[attention][backward][codegen]") {
  using codegen::BackwardPart;
  auto sparse = [](int head_dim, int block, bool deterministic) {
    AttentionSpec s = backward_spec(head_dim, deterministic);
    s.sparsity = Sparsity::block_sparse;
    s.block_size = block;
    return s;
  };
  for (const int d : {64, 96, 128, 256})
    for (const bool det : {false, true}) {
      CAPTURE(d, det);
      for (const int block : {16, 32, 64, 128}) {
        CAPTURE(block);
        const AttentionSpec spec = sparse(d, block, det);
        const codegen::BackwardTiling dkdv = codegen::default_backward_tiling(spec, BackwardPart::dkdv, true);
        // A run is one pattern block: as many as the tile's queries hold, where they hold more than one.
        const int runs = dkdv.block_cols > block ? dkdv.block_cols / block : 1;
        CHECK(codegen::dkdv_query_runs(spec, dkdv) == runs);
        CHECK_THAT(codegen::attention_backward_source(spec, dkdv).source,
                   Contains(fmt::format("static constexpr int query_runs = {};", runs)));
        // The mma.sync pass, and the dQ pass, walk contiguous tiles.
        const codegen::BackwardTiling mma = codegen::default_backward_tiling(spec, BackwardPart::dkdv, false);
        CHECK(codegen::dkdv_query_runs(spec, mma) == 1);
        CHECK(codegen::dkdv_query_runs(spec, codegen::default_backward_tiling(spec, BackwardPart::dq, true)) == 1);
      }
      const AttentionSpec dense = backward_spec(d, det);
      CHECK(codegen::dkdv_query_runs(dense, codegen::default_backward_tiling(dense, BackwardPart::dkdv, true)) == 1);
    }
}

TEST_CASE("the Hopper dK/dV and dQ kernels compile for sm_90a without spills", "[attention][backward][codegen][nvrtc]") {
  const CacheSettings saved = cache_settings();
  set_cache_settings({saved.dir, CacheMode::off, saved.max_bytes});
  const std::vector<std::string> keys = {
      "attention:d=128,dtype=bf16,causal=tl,sparsity=bsr,block=64,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      "attention:d=64,dtype=f16,pass=bwd,det=1|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      // d = 64's 128-query tiles with atomic dQ (each warpgroup's dQ product over half the queries).
      "attention:d=64,dtype=bf16,causal=tl,pass=bwd|part=dkdv,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=64,dtype=f16,causal=br,sparsity=bsr,block=128,pass=bwd|part=dkdv,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=128,dtype=bf16,causal=br,sparsity=bsr,block=64,pass=bwd,det=1|part=dq,warps=8,cols=64,stages=2,path=wgmma",
      "attention:d=128,dtype=bf16,pass=bwd,det=1|part=dq,warps=8,cols=64,stages=3,path=wgmma",
      "attention:d=128,dtype=bf16,causal=br,sparsity=bsr,block=128,pass=bwd,det=1|part=dq,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=64,dtype=f16,causal=tl,pass=bwd,det=1|part=dq,warps=8,cols=64,stages=3,path=wgmma",
      "attention:d=96,dtype=bf16,causal=br,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      "attention:d=96,dtype=f16,sparsity=bsr,block=128,pass=bwd,det=1|part=dq,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=256,dtype=bf16,causal=br,pass=bwd|part=dkdv,warps=4,cols=64,stages=2,path=wgmma",
      "attention:d=256,dtype=f16,causal=tl,sparsity=bsr,block=16,pass=bwd|part=dkdv,warps=4,cols=64,stages=2,path=wgmma",
      "attention:d=256,dtype=bf16,causal=tl,sparsity=bsr,block=32,pass=bwd|part=dq,warps=4,cols=64,stages=2,path=wgmma",
      // Query runs of one pattern block (PackedQueries): 2 and 4 a tile.
      "attention:d=128,dtype=bf16,causal=br,sparsity=bsr,block=32,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      "attention:d=128,dtype=f16,sparsity=bsr,block=16,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      "attention:d=64,dtype=bf16,causal=tl,sparsity=bsr,block=16,pass=bwd,det=1|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      "attention:d=96,dtype=bf16,sparsity=bsr,block=32,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      // d = 64's 128-query tiles packed from 8 and 4 runs, one copy of the walk (the helpers take 56
      // registers where eight runs are located with atomic dQ), and their 64-query tiles for short walks.
      "attention:d=64,dtype=bf16,sparsity=bsr,block=16,pass=bwd|part=dkdv,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=64,dtype=f16,causal=br,sparsity=bsr,block=16,pass=bwd,det=1|part=dkdv,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=64,dtype=bf16,causal=tl,sparsity=bsr,block=32,pass=bwd|part=dkdv,warps=8,cols=128,stages=2,path=wgmma",
      "attention:d=64,dtype=bf16,sparsity=bsr,block=16,pass=bwd|part=dkdv,warps=8,cols=64,stages=2,path=wgmma",
      // Blocks of 64 on the gathered backward: the key-block dK/dV pass and the gathered dQ pass.
      "attention:d=128,dtype=bf16,causal=br,sparsity=bsr,block=64,pass=bwd,det=1|part=dkdv,warps=4,cols=64,stages=2,path=wgmma_gather,block=64",
      "attention:d=96,dtype=f16,causal=tl,sparsity=bsr,block=64,pass=bwd|part=dkdv,warps=4,cols=64,stages=2,path=wgmma_gather,block=64",
      "attention:d=64,dtype=bf16,sparsity=bsr,block=64,pass=bwd|part=dkdv,warps=4,cols=64,stages=2,path=wgmma_gather,block=64",
      "attention:d=128,dtype=bf16,sparsity=bsr,block=64,pass=bwd,det=1|part=dq,warps=4,cols=64,stages=2,path=wgmma_gather,block=64",
  };
  std::vector<std::future<CompiledKernel>> compiled;
  for (const std::string& k : keys)
    compiled.push_back(std::async(std::launch::async, [k] { return compile_key(k, "sm_90a"); }));
  for (std::size_t n = 0; n < keys.size(); ++n) {
    CAPTURE(keys[n]);
    const CompiledKernel k = compiled[n].get();
    CHECK(k.usage.registers > 0);
    // At d = 128 with blocks of 64 (the tile's work in two copies, for a warpgroup whose keys are
    // inactive or not) ptxas spills 16 bytes; measured 16-20% faster than the one copy without spills
    // (docs/attention-log.md, "Landed: the dK/dV pass skips a warpgroup's inactive keys").
    const bool two_copies_d128 = keys[n].find("d=128") != std::string::npos && keys[n].find("block=64") != std::string::npos &&
                                 keys[n].find("part=dkdv") != std::string::npos;
    CHECK(k.usage.spill_store_bytes <= (two_copies_d128 ? 16 : 0));
    // ptxas serializes every wgmma of a kernel where one waits in a branch it deems divergent (C7520:
    // a 64 x 32 dQ product for d = 96's second warpgroup alone did, 17% slower), or where the waits'
    // counts depend on the loop (C7514: the dQ pass with three slots did).
    CHECK_THAT(k.log, !Contains("are serialized"));
  }
  set_cache_settings(saved);
}

TEST_CASE("attention_kernel_keys names the kernels an Attention loads, per arch", "[attention][backward][spec]") {
  AttentionSpec spec;
  spec.head_dim = 128;
  spec.sparsity = Sparsity::block_sparse;
  spec.block_size = 128;  // (smaller blocks add gathered kernels: below)
  const std::string fwd = "attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block=128,pass=fwd|";
  const std::string bwd = "attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block=128,pass=bwd|";
  // The forward's default tiling for the device, then the backward's pre-pass, dK/dV and dQ parts.
  const std::vector<std::string> hopper = attention_kernel_keys(spec, "sm_90a");
  // Then the deterministic twin's three, whose dQ pass the backward may choose on Hopper.
  REQUIRE(hopper.size() == 7);
  CHECK(hopper[0] == fwd + key(resolve(spec, {}, 90)));
  CHECK_THAT(hopper[0], Contains("path=wgmma"));
  CHECK(hopper[1] == bwd + codegen::key(codegen::default_backward_tiling(spec, codegen::BackwardPart::prep, true)));
  CHECK_THAT(hopper[2], Contains("part=dkdv") && Contains("path=wgmma"));
  CHECK_THAT(hopper[3], Contains("part=dq_convert"));  // atomic dQ by default
  for (std::size_t n = 4; n < 7; ++n) CHECK_THAT(hopper[n], Contains("det=1"));
  CHECK_THAT(hopper[6], Contains("part=dq,") && Contains("path=wgmma"));
  const std::vector<std::string> ampere = attention_kernel_keys(spec, "sm_80");
  CHECK(ampere.size() == 4);  // no wgmma dQ pass to choose
  CHECK(ampere[0] == fwd + key(resolve(spec, {}, 80)));
  CHECK_THAT(ampere[0], Contains("path=mma"));
  CHECK_THAT(ampere[2], !Contains("wgmma"));
  CHECK_THAT(attention_kernel_keys(spec, "sm_90")[2], !Contains("wgmma"));  // no arch-specific features
  spec.deterministic = true;  // a dQ pass of its own; the forward key ignores the option
  const std::vector<std::string> det = attention_kernel_keys(spec, "sm_90a");
  REQUIRE(det.size() == 4);
  CHECK(det[0] == hopper[0]);
  CHECK(det[3] == hopper[6]);
  CHECK_THAT(det[3], Contains("part=dq,") && Contains("det=1"));
  // Each key compiles (the forward, the conversion and the Hopper dQ pass here; the others share their
  // templates).
  const CacheSettings saved = cache_settings();
  set_cache_settings({saved.dir, CacheMode::off, saved.max_bytes});
  for (const std::string& k : {hopper[0], hopper[3], hopper[6]}) {
    CAPTURE(k);
    CHECK(compile_key(k, "sm_90a").usage.registers > 0);
  }
  set_cache_settings(saved);
  CHECK_THROWS_WITH(attention_kernel_keys(spec, "sm_75"), Contains("sm_75") && Contains("sm_80 or later"));
  CHECK_THROWS_WITH(attention_kernel_keys(spec, "gfx90a"), Contains("gfx90a"));
  spec.sparsity = Sparsity::baked;
  CHECK_THROWS_WITH(attention_kernel_keys(spec, "sm_90a"), Contains("baked"));
}

TEST_CASE("the gathered backward's tilings: key text, which specs have them, refusals", "[attention][backward][codegen]") {
  using codegen::BackwardPart;
  AttentionSpec spec = backward_spec(128, false);
  spec.sparsity = Sparsity::block_sparse;
  for (const int block : {16, 32, 64})
    for (const BackwardPart part : {BackwardPart::dkdv, BackwardPart::dq}) {
      spec.block_size = block;
      const std::optional<codegen::BackwardTiling> t = codegen::gathered_backward_tiling(spec, part);
      REQUIRE(t.has_value());
      const std::string text = codegen::key(*t);
      CAPTURE(text);
      CHECK(text == fmt::format("part={},warps=4,cols=64,stages=2,path=wgmma_gather,block={}",
                                part == BackwardPart::dq ? "dq" : "dkdv", block));
      CHECK(codegen::parse_backward_tiling(text) == *t);
      CHECK(t->block_rows() == block);  // a pattern block a CTA
      CHECK(t->threads() == 128);       // one warpgroup
      const codegen::KernelSource source = codegen::attention_backward_source(spec, *t);
      // Blocks of 64 fill a product's rows: their dK/dV pass keeps keys as rows, a kernel of its own.
      const bool key_block = block == 64 && part == BackwardPart::dkdv;
      CHECK_THAT(source.source, Contains(key_block ? "attention_backward_sm90_key_block.cuh" : "attention_backward_sm90_gather.cuh"));
      CHECK(source.name_expression == fmt::format("sjit_kernels::attention_backward_{}_sm90_{}<Cfg>",
                                                  part == BackwardPart::dq ? "dq" : "dkdv", key_block ? "key_block" : "gather"));
      CHECK(source.dynamic_shared_bytes <= 232448);
      // The spec's blocks must be the tiling's.
      AttentionSpec other = spec;
      other.block_size = block == 16 ? 32 : 16;
      CHECK_THROWS_WITH(codegen::attention_backward_source(other, *t),
                        Contains("block = the pattern's") && Contains(text));
    }
  // Only blocks of 16, 32 and 64 at d = 64, 96 and 128, and only the two passes.
  spec.block_size = 128;
  CHECK_FALSE(codegen::gathered_backward_tiling(spec, BackwardPart::dkdv));
  spec.block_size = 16;
  CHECK_FALSE(codegen::gathered_backward_tiling(spec, BackwardPart::prep));
  CHECK_FALSE(codegen::gathered_backward_tiling(backward_spec(128, false), BackwardPart::dkdv));  // dense
  AttentionSpec wide = spec;
  wide.head_dim = 256;
  CHECK_FALSE(codegen::gathered_backward_tiling(wide, BackwardPart::dq));
  // The key text's refusals name what exists.
  for (const char* bad : {"part=prep,warps=4,cols=64,stages=2,path=wgmma_gather,block=16",
                          "part=dkdv,warps=8,cols=64,stages=2,path=wgmma_gather,block=16",
                          "part=dkdv,warps=4,cols=64,stages=2,path=wgmma_gather,block=128",
                          "part=dq,warps=4,cols=64,stages=2,path=wgmma_gather"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(codegen::parse_backward_tiling(bad),
                      Contains("path=wgmma_gather exists for part=dkdv and part=dq") && Contains(bad));
  }
  CHECK_THROWS_WITH(codegen::parse_backward_tiling("part=dq,warps=4,cols=64,stages=2,path=gather"),
                    Contains("'gather'") && Contains("mma, wgmma or wgmma_gather"));
}

TEST_CASE("attention_kernel_keys adds the wide and gathered tilings of small pattern blocks on sm_90a",
          "[attention][spec]") {
  AttentionSpec spec;
  spec.head_dim = 128;
  spec.sparsity = Sparsity::block_sparse;
  for (const int bs : {16, 32}) {
    spec.block_size = bs;
    CAPTURE(bs);
    const std::vector<std::string> hopper = attention_kernel_keys(spec, "sm_90a");
    // The forward; the backward's three and its gathered dK/dV pass; its deterministic twin's three, and
    // its gathered dK/dV and dQ passes; the wide forward, and the gathered-key forwards: with blocks of
    // 16 for 1, 2 and 4 query heads a CTA, of 32 for 2.
    REQUIRE(hopper.size() == (bs == 16 ? 14u : 12u));
    const std::string fwd = fmt::format("attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block={},pass=fwd|", bs);
    const std::string bwd = fmt::format("attention:d=128,dtype=bf16,causal=none,sparsity=bsr,block={},pass=bwd", bs);
    const std::string gathered = fmt::format("warps=4,cols=64,stages=2,path=wgmma_gather,block={}", bs);
    CHECK(hopper[0] == fwd + fmt::format("warps=4,mt=1,bn={},stages=2,qreg=0,path=wgmma", bs));
    CHECK(hopper[4] == bwd + "|part=dkdv," + gathered);
    CHECK(hopper[8] == bwd + ",det=1|part=dkdv," + gathered);
    CHECK(hopper[9] == bwd + ",det=1|part=dq," + gathered);
    CHECK(hopper[10] == fwd + "warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma_ws");
    if (bs == 16) {
      CHECK(hopper[11] == fwd + "warps=4,mt=1,bn=16,stages=2,qreg=0,path=wgmma_gather");
      CHECK(hopper[13] == fwd + "warps=4,mt=4,bn=16,stages=2,qreg=0,path=wgmma_gather");
    } else {
      CHECK(hopper[11] == fwd + "warps=4,mt=2,bn=32,stages=2,qreg=0,path=wgmma_gather");
    }
    CHECK(attention_kernel_keys(spec, "sm_80").size() == 4);  // no wgmma kernels there
  }
  // Blocks of 64: the gathered backward only (the forward's tiles are one block wide already), at
  // d = 128 only its dQ pass's way (its atomic dK/dV pass never runs unforced there).
  spec.block_size = 64;
  const std::string gathered = "warps=4,cols=64,stages=2,path=wgmma_gather,block=64";
  for (const int d : {128, 64}) {
    CAPTURE(d);
    spec.head_dim = d;
    const std::vector<std::string> keys = attention_kernel_keys(spec, "sm_90a");
    const std::string bwd = fmt::format("attention:d={},dtype=bf16,causal=none,sparsity=bsr,block=64,pass=bwd", d);
    REQUIRE(keys.size() == (d == 128 ? 9u : 10u));
    if (d == 64) CHECK(keys[4] == bwd + "|part=dkdv," + gathered);
    CHECK(keys[keys.size() - 2] == bwd + ",det=1|part=dkdv," + gathered);
    CHECK(keys.back() == bwd + ",det=1|part=dq," + gathered);
    if (d == 128)
      for (std::size_t n = 0; n + 2 < keys.size(); ++n) CHECK_THAT(keys[n], !Contains("wgmma_gather"));
  }
  // d = 64 with blocks of 16 and 32: the dK/dV pass's 128-query tiles, and its 64-query ones for
  // short walks, each way of summing dQ.
  spec.head_dim = 64;
  for (const int bs : {16, 32}) {
    spec.block_size = bs;
    CAPTURE(bs);
    const std::vector<std::string> keys = attention_kernel_keys(spec, "sm_90a");
    const std::string bwd = fmt::format("attention:d=64,dtype=bf16,causal=none,sparsity=bsr,block={},pass=bwd", bs);
    for (const char* det : {"", ",det=1"})
      for (const char* cols : {"cols=128", "cols=64"}) {
        CAPTURE(det, cols);
        const std::string want = fmt::format("{}{}|part=dkdv,warps=8,{},stages=2,path=wgmma", bwd, det, cols);
        CHECK(std::count(keys.begin(), keys.end(), want) == 1);
      }
  }
  spec.block_size = 32;
  spec.head_dim = 256;  // no persistent kernel at d = 256: the one-item kernel's 128 x 64 tiles; no gathering
  CHECK_THAT(attention_kernel_keys(spec, "sm_90a").back(), Contains("d=256") && EndsWith("bn=64,stages=2,qreg=0,path=wgmma"));
  spec.head_dim = 32;  // no wgmma kernel at all
  for (const std::string& k : attention_kernel_keys(spec, "sm_90a")) CHECK_THAT(k, !Contains("path=wgmma"));
}
