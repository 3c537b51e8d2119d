// Attention forward on the host side: spec key text, tilings, the block-sparse tile schedule against an
// element-by-element expansion of the pattern, FLOP counts against a brute-force count of the allowed
// (query, key) pairs, argument checks that run before any GPU work, and NVRTC compiles of the kernel.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <future>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "attention/gathered_keys.h"
#include "attention/packed_queries.h"
#include "attention/tile_schedule.h"
#include "attention/wide_tiles.h"
#include "sparsejit/attention_reference.h"
#include "sparsejit/sparsejit.h"
#include "support/test_support.h"
#include "templates/sparsejit/attention_params.cuh"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {

constexpr int kHeadDims[] = {32, 64, 96, 128, 256};
constexpr int kBlockSizes[] = {16, 32, 64, 128};

// Field values as the key text spells them (docs/attention.md), written out here rather than taken
// from the name() functions under test.
struct Spelled {
  Causal causal;
  const char* text;
};
constexpr Spelled kCausals[] = {{Causal::none, "none"}, {Causal::top_left, "tl"}, {Causal::bottom_right, "br"}};

AttentionSpec make_spec(int head_dim, DType dtype, Causal causal, Sparsity sparsity, int block_size,
                        std::uint64_t digest = 0, Pass pass = Pass::forward) {
  AttentionSpec s;
  s.head_dim = head_dim;
  s.dtype = dtype;
  s.causal = causal;
  s.sparsity = sparsity;
  s.block_size = block_size;
  s.pattern_digest = digest;
  s.pass = pass;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// 1. Spec key text
// ---------------------------------------------------------------------------------------------------

TEST_CASE("attention key text has the documented form and round-trips for every field combination",
          "[attention][spec]") {
  std::mt19937_64 rng(test::fresh_seed());
  int checked = 0;
  for (int d : kHeadDims)
    for (DType dtype : {DType::f16, DType::bf16})
      for (const Spelled& causal : kCausals)
        for (Pass pass : {Pass::forward, Pass::backward})
          for (Sparsity sparsity : {Sparsity::dense, Sparsity::block_sparse, Sparsity::baked})
            for (int bs : kBlockSizes) {
              if (sparsity == Sparsity::dense && bs != 16) continue;  // the block size does not apply
              const std::uint64_t digest = sparsity == Sparsity::baked ? rng() : 0;
              const AttentionSpec s =
                  make_spec(d, dtype, causal.causal, sparsity, sparsity == Sparsity::dense ? 0 : bs, digest, pass);
              std::string expected = fmt::format("attention:d={},dtype={},causal={},sparsity={}", d,
                                                 dtype == DType::f16 ? "f16" : "bf16", causal.text,
                                                 sparsity == Sparsity::dense         ? "dense"
                                                 : sparsity == Sparsity::block_sparse ? "bsr"
                                                                                      : "baked");
              if (sparsity != Sparsity::dense) expected += fmt::format(",block={}", bs);
              expected += pass == Pass::forward ? ",pass=fwd" : ",pass=bwd";
              if (sparsity == Sparsity::baked) expected += fmt::format(",pattern={:016x}", digest);
              CAPTURE(expected);
              CHECK(key(s) == expected);
              CHECK(parse_attention(expected) == s);
              CHECK(key(parse_attention(key(s))) == key(s));
              ++checked;
            }
  CHECK(checked == 5 * 2 * 3 * 2 * (1 + 4 + 4));
}

TEST_CASE("attention key text: defaults, field order, and digests with every hex digit", "[attention][spec]") {
  SECTION("missing fields take their defaults") {
    CHECK(parse_attention("attention:d=64") == make_spec(64, DType::bf16, Causal::none, Sparsity::dense, 0));
  }
  SECTION("fields may come in any order") {
    CHECK(parse_attention("attention:block=32,sparsity=bsr,causal=br,dtype=f16,d=96") ==
          make_spec(96, DType::f16, Causal::bottom_right, Sparsity::block_sparse, 32));
  }
  SECTION("a digest is 16 hex digits, either case, leading zeros kept") {
    const AttentionSpec s = parse_attention("attention:d=128,sparsity=baked,block=64,pattern=00000000DeadBeef");
    CHECK(s.pattern_digest == 0xdeadbeefull);
    CHECK_THAT(key(s), Contains("pattern=00000000deadbeef"));
    CHECK(parse_attention("attention:d=128,sparsity=baked,block=64,pattern=ffffffffffffffff").pattern_digest ==
          ~0ull);
  }
}

TEST_CASE("canonical() clears the block size and digest where they do not apply", "[attention][spec]") {
  SECTION("dense: both cleared, even a block size no sparse spec could have") {
    const AttentionSpec c = canonical(make_spec(64, DType::f16, Causal::top_left, Sparsity::dense, 48, 0x1234));
    CHECK(c.block_size == 0);
    CHECK(c.pattern_digest == 0);
    CHECK(c.head_dim == 64);
    CHECK(c.causal == Causal::top_left);
  }
  SECTION("bsr: the digest cleared, the block size kept") {
    const AttentionSpec c = canonical(make_spec(64, DType::f16, Causal::none, Sparsity::block_sparse, 32, 0x1234));
    CHECK(c.block_size == 32);
    CHECK(c.pattern_digest == 0);
  }
  SECTION("baked: both kept") {
    const AttentionSpec c = canonical(make_spec(64, DType::f16, Causal::none, Sparsity::baked, 128, 0x1234));
    CHECK(c.block_size == 128);
    CHECK(c.pattern_digest == 0x1234);
  }
  SECTION("specs equal after canonical() have the same key") {
    CHECK(key(make_spec(32, DType::bf16, Causal::none, Sparsity::dense, 64, 7)) ==
          key(make_spec(32, DType::bf16, Causal::none, Sparsity::dense, 0, 0)));
  }
}

TEST_CASE("bad attention specs are refused with a message naming the field and value", "[attention][spec]") {
  SECTION("head_dim") {
    CHECK_THROWS_AS(parse_attention("attention:d=80"), InvalidSpec);
    CHECK_THROWS_WITH(parse_attention("attention:d=80"), Contains("head_dim = 80"));
    CHECK_THROWS_WITH(canonical(make_spec(80, DType::bf16, Causal::none, Sparsity::dense, 0)),
                      Contains("head_dim = 80"));
    CHECK_THROWS_WITH(parse_attention("attention:d=sixty"), Contains("'d'") && Contains("sixty"));
  }
  SECTION("dtype") {
    CHECK_THROWS_AS(parse_attention("attention:d=64,dtype=f32"), InvalidSpec);
    CHECK_THROWS_WITH(parse_attention("attention:d=64,dtype=f32"), Contains("dtype = f32"));
    CHECK_THROWS_WITH(key(make_spec(64, DType::f32, Causal::none, Sparsity::dense, 0)), Contains("dtype = f32"));
  }
  SECTION("block size") {
    CHECK_THROWS_AS(parse_attention("attention:d=64,sparsity=bsr,block=48"), InvalidSpec);
    CHECK_THROWS_WITH(parse_attention("attention:d=64,sparsity=bsr,block=48"), Contains("block_size = 48"));
    CHECK_THROWS_WITH(parse_attention("attention:d=64,sparsity=baked,block=256,pattern=0000000000000001"),
                      Contains("block_size = 256"));
    CHECK_THROWS_WITH(canonical(make_spec(64, DType::f16, Causal::none, Sparsity::block_sparse, 0)),
                      Contains("block_size = 0"));
    CHECK_THROWS_WITH(parse_attention("attention:d=64,sparsity=bsr"), Contains("'block'"));
  }
  SECTION("unknown fields and values") {
    CHECK_THROWS_AS(parse_attention("attention:d=64,colour=red"), InvalidSpec);
    CHECK_THROWS_WITH(parse_attention("attention:d=64,colour=red"), Contains("colour"));
    // Fields of other sparsities are not silently dropped.
    CHECK_THROWS_WITH(parse_attention("attention:d=64,block=64"), Contains("'block'"));
    CHECK_THROWS_WITH(parse_attention("attention:d=64,sparsity=bsr,block=64,pattern=0000000000000001"),
                      Contains("'pattern'"));
    CHECK_THROWS_WITH(parse_attention("attention:d=64,causal=diag"), Contains("causal") && Contains("diag"));
    CHECK_THROWS_WITH(parse_attention("attention:d=64,sparsity=csr"), Contains("sparsity") && Contains("csr"));
    CHECK_THROWS_WITH(parse_attention("attention:d=64,pass=both"), Contains("pass") && Contains("both"));
    CHECK_THROWS_WITH(parse_attention("rownorm:d=64"), Contains("not an attention spec"));
    CHECK_THROWS_WITH(parse_attention("attention:dtype=f16"), Contains("'d'"));
  }
  SECTION("pattern digest") {
    const std::string prefix = "attention:d=64,sparsity=baked,block=64,pattern=";
    for (const char* bad : {"xyz", "123456789abcdef", "123456789abcdef01", "123456789abcdefg", "0000000000000000x"}) {
      CAPTURE(bad);
      CHECK_THROWS_AS(parse_attention(prefix + bad), InvalidSpec);
      CHECK_THROWS_WITH(parse_attention(prefix + bad), Contains("pattern") && Contains(bad));
    }
    CHECK_THROWS_WITH(parse_attention("attention:d=64,sparsity=baked,block=64"), Contains("'pattern'"));
  }
}

// A digest is "16 hexadecimal digits" (attention_spec.h): text that only strtoull accepts names no
// digest. Accepting it gives one kernel several key texts.
TEST_CASE("a pattern digest with a sign, a 0x prefix or blanks is refused", "[attention][spec]") {
  const std::string prefix = "attention:d=64,sparsity=baked,block=64,pattern=";
  for (const char* bad : {"0x00000000000001", "+00000000000001f", "-000000000000001", " 00000000000001f"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(parse_attention(prefix + bad), InvalidSpec);
  }
}

// ---------------------------------------------------------------------------------------------------
// 2. Tilings
// ---------------------------------------------------------------------------------------------------

TEST_CASE("attention config key text round-trips", "[attention][config]") {
  for (int warps : {0, 4, 8})
    for (int mt : {0, 1, 2})
      for (int bn : {0, 16, 32, 64, 128})
        for (int stages : {0, 2, 3})
          for (int qreg : {-1, 0, 1}) {
            const AttentionConfig c{warps, mt, bn, stages, qreg};
            const std::string text = fmt::format("warps={},mt={},bn={},stages={},qreg={}", warps, mt, bn, stages, qreg);
            CAPTURE(text);
            CHECK(key(c) == text);
            CHECK(parse_attention_config(text) == c);
          }
  CHECK(parse_attention_config("bn=32,stages=3,mt=1,warps=8") == AttentionConfig{8, 1, 32, 3, -1});
  CHECK_THROWS_WITH(parse_attention_config("warps=4,mt=1,bn=64,stages=2,colour=2"), Contains("colour"));
  CHECK_THROWS_WITH(parse_attention_config("warps=4,mt=1,bn=64"), Contains("stages"));
}

TEST_CASE("attention config key text: the kernel path", "[attention][config]") {
  // Text without a path (the old form) parses as automatic, and automatic prints no path.
  CHECK(parse_attention_config("warps=4,mt=2,bn=64,stages=2,qreg=0").path == AttentionPath::automatic);
  for (const auto& [path, text_of_path] : {std::pair{AttentionPath::mma, "mma"}, std::pair{AttentionPath::wgmma, "wgmma"},
                                            std::pair{AttentionPath::wgmma_ws, "wgmma_ws"},
                                            std::pair{AttentionPath::wgmma_gather, "wgmma_gather"}}) {
    AttentionConfig c{8, 1, 128, 2, 0};
    c.path = path;
    const std::string text = fmt::format("warps=8,mt=1,bn=128,stages=2,qreg=0,path={}", text_of_path);
    CHECK(key(c) == text);
    CHECK(parse_attention_config(text) == c);
  }
  CHECK(parse_attention_config("warps=8,mt=1,bn=128,stages=2,path=auto").path == AttentionPath::automatic);
  CHECK_THROWS_WITH(parse_attention_config("warps=8,mt=1,bn=128,stages=2,path=tma"), Contains("path = 'tma'"));
}

TEST_CASE("resolve() on the wgmma path: defaults, checks, and which path an unset config takes", "[attention][config]") {
  AttentionConfig wgmma;
  wgmma.path = AttentionPath::wgmma;
  for (int d : {64, 128})
    for (Sparsity sparsity : {Sparsity::dense, Sparsity::block_sparse})
      for (int bs : {16, 64, 128}) {
        const AttentionSpec spec = make_spec(d, DType::f16, Causal::top_left, sparsity, bs, 1);
        CAPTURE(key(spec));
        const AttentionConfig c = resolve(spec, wgmma);
        CHECK(c.path == AttentionPath::wgmma);
        CHECK(c.m_tiles == 1);
        CHECK((c.warps == 4 || c.warps == 8));
        // Pattern blocks of 16 and 32: tiles one key block wide.
        CHECK(c.block_n == (sparsity != Sparsity::dense && bs <= 32 ? bs : c.block_n == 64 ? 64 : 128));
        CHECK(c.q_in_registers == 0);
        CHECK(resolve(spec, c) == c);
        CHECK(parse_attention_config(key(c)) == c);
        // Pattern blocks of 64 or less, d = 64 causal with a pattern (the spec here is causal), and
        // dense d = 64: one warpgroup, 64 query rows (see wgmma_default_config); dense d = 64 with
        // 128-key tiles.
        const bool one_warpgroup = sparsity != Sparsity::dense ? bs <= 64 || d == 64 : d == 64;
        CHECK(c.block_m() == (one_warpgroup ? 64 : 128));
        if (sparsity == Sparsity::dense && d == 64) CHECK(c.block_n == 128);
      }
  const AttentionSpec d128 = make_spec(128, DType::bf16, Causal::none, Sparsity::dense, 0);
  AttentionConfig bad = wgmma;
  bad.m_tiles = 2;
  CHECK_THROWS_WITH(resolve(d128, bad), Contains("mt = 2") && Contains("wgmma"));
  bad = wgmma, bad.block_n = 32;  // taken: the one-item kernel has 16- and 32-key tiles
  CHECK(resolve(d128, bad).block_n == 32);
  CHECK(resolve(d128, AttentionConfig{4, 1, 16, 2, 0, AttentionPath::wgmma}).block_n == 16);
  CHECK_THROWS_WITH(resolve(make_spec(32, DType::bf16, Causal::none, Sparsity::dense, 0), wgmma),
                    Contains("head_dim 64, 96, 128 or 256, not 32"));
  // d = 256: the one-item kernel with 64-key tiles (two warpgroups, Q and two slots: 193 KB); 128-key
  // tiles do not fit, and the persistent kernel refuses it.
  const AttentionSpec d256 = make_spec(256, DType::bf16, Causal::none, Sparsity::dense, 0);
  const AttentionConfig d256_default = resolve(d256, wgmma);
  CHECK(d256_default.block_n == 64);
  CHECK(d256_default.block_m() == 128);
  bad = wgmma, bad.block_n = 128;
  CHECK_THROWS_WITH(resolve(d256, bad), Contains("shared memory"));
  AttentionConfig ws256;
  ws256.path = AttentionPath::wgmma_ws;
  CHECK_THROWS_WITH(resolve(d256, ws256), Contains("head_dim 64, 96 or 128, not 256"));
  bad = AttentionConfig{8, 1, 128, 3, 0}, bad.path = AttentionPath::wgmma;  // 225 KB: fits (barely)
  CHECK_NOTHROW(resolve(d128, bad));
  // The persistent kernel: the same checks naming its path, and its output staging rows on top.
  AttentionConfig ws;
  ws.path = AttentionPath::wgmma_ws;
  const AttentionConfig ws_default = resolve(d128, ws);
  CHECK(ws_default.path == AttentionPath::wgmma_ws);
  CHECK(ws_default.block_m() == 128);
  CHECK(parse_attention_config(key(ws_default)) == ws_default);
  bad = ws, bad.block_n = 32;
  CHECK_THROWS_WITH(resolve(d128, bad), Contains("bn = 32") && Contains("wgmma_ws takes 64 or 128"));
  bad = AttentionConfig{8, 1, 128, 3, 0}, bad.path = AttentionPath::wgmma_ws;
  CHECK_THROWS_WITH(resolve(d128, bad), Contains("shared memory"));
  // The gathered-key kernel: patterns of blocks of 16 or 32 only, one warpgroup, the block as its
  // key tile and its query tile, two slots; each refusal names the field and what it takes.
  AttentionConfig gather;
  gather.path = AttentionPath::wgmma_gather;
  for (const int bs : {16, 32}) {
    const AttentionSpec small = make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, bs);
    const AttentionConfig g = resolve(small, gather);
    CHECK(g == AttentionConfig{4, 1, bs, 2, 0, AttentionPath::wgmma_gather});
    CHECK(g.block_m() == bs);
    CHECK(parse_attention_config(key(g)) == g);
  }
  const AttentionSpec bs16 = make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, 16);
  CHECK_THROWS_WITH(resolve(d128, gather), Contains("wgmma_gather takes patterns of blocks of 16 or 32, not a dense spec"));
  CHECK_THROWS_WITH(resolve(make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, 64), gather),
                    Contains("not blocks of 64"));
  bad = gather, bad.block_n = 32;
  CHECK_THROWS_WITH(resolve(bs16, bad), Contains("bn = 32") && Contains("the pattern's block size, 16"));
  bad = gather, bad.warps = 8;
  CHECK_THROWS_WITH(resolve(bs16, bad), Contains("warps = 8") && Contains("one warpgroup"));
  bad = gather, bad.stages = 3;
  CHECK_THROWS_WITH(resolve(bs16, bad), Contains("stages = 3") && Contains("wgmma_gather"));
  bad = gather, bad.m_tiles = 4;  // four query heads of blocks of 16 a CTA: 64 columns, taken
  CHECK(resolve(bs16, bad).m_tiles == 4);
  bad = gather, bad.m_tiles = 3;
  CHECK_THROWS_WITH(resolve(bs16, bad), Contains("mt = 3") && Contains("1, 2 or 4 query heads"));
  bad = gather, bad.m_tiles = 4, bad.block_n = 32;  // 128 columns: too many
  CHECK_THROWS_WITH(resolve(make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, 32), bad),
                    Contains("mt = 4") && Contains("here 1 or 2 for blocks of 32"));
  CHECK_THROWS_WITH(resolve(make_spec(32, DType::bf16, Causal::none, Sparsity::block_sparse, 16), gather),
                    Contains("head_dim 64, 96, 128 or 256, not 32"));
  // A config with tiling fields but no path keeps meaning the mma.sync kernel, on any device.
  CHECK(resolve(d128, AttentionConfig{8, 2, 32, 3, 0}, 90).path == AttentionPath::mma);
  // With nothing set, the path is the device's default; without a device (0) it is mma.sync.
  CHECK(resolve(d128, {}, 0).path == AttentionPath::mma);
  CHECK(resolve(d128, {}, 80).path == AttentionPath::mma);
  CHECK(default_config(d128, 0).path == AttentionPath::mma);
  // On compute capability 9.0 the default is wgmma where it was measured faster (see default_config).
  auto path_on_h100 = [](int d, Causal causal, Sparsity sparsity, int bs) {
    return resolve(make_spec(d, DType::f16, causal, sparsity, bs), {}, 90).path;
  };
  CHECK(path_on_h100(128, Causal::none, Sparsity::dense, 0) == AttentionPath::wgmma_ws);
  CHECK(path_on_h100(64, Causal::none, Sparsity::block_sparse, 128) == AttentionPath::wgmma_ws);
  CHECK(path_on_h100(64, Causal::none, Sparsity::dense, 0) == AttentionPath::wgmma);
  CHECK(path_on_h100(128, Causal::top_left, Sparsity::block_sparse, 128) == AttentionPath::wgmma_ws);
  CHECK(path_on_h100(128, Causal::none, Sparsity::block_sparse, 64) == AttentionPath::wgmma);
  CHECK(path_on_h100(64, Causal::top_left, Sparsity::dense, 0) == AttentionPath::wgmma);
  CHECK(path_on_h100(64, Causal::bottom_right, Sparsity::block_sparse, 64) == AttentionPath::wgmma);
  CHECK(path_on_h100(64, Causal::top_left, Sparsity::block_sparse, 128) == AttentionPath::wgmma);
  CHECK(resolve(make_spec(64, DType::bf16, Causal::top_left, Sparsity::block_sparse, 128), {}, 90).block_m() == 64);
  // Small pattern blocks: on Hopper one warpgroup on tiles one key block wide, on mma.sync 64-row tiles
  // of 32 keys, or of one key block of 16.
  for (const int bs : {16, 32, 64}) {
    CAPTURE(bs);
    const AttentionSpec spec = make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, bs);
    const AttentionConfig small = resolve(spec, {});
    CHECK(small.path == AttentionPath::mma);
    CHECK(small.block_m() == 64);
    CHECK(small.block_n == std::min(bs, 32));
    const AttentionConfig hopper = resolve(spec, {}, 90);
    CHECK(hopper.path == AttentionPath::wgmma);
    CHECK(hopper.block_m() == 64);
    CHECK(hopper.block_n == bs);
  }
  CHECK(path_on_h100(64, Causal::top_left, Sparsity::block_sparse, 16) == AttentionPath::wgmma);
  CHECK(path_on_h100(256, Causal::none, Sparsity::dense, 0) == AttentionPath::wgmma);
  CHECK(path_on_h100(256, Causal::top_left, Sparsity::block_sparse, 128) == AttentionPath::wgmma);
  CHECK(resolve(make_spec(256, DType::bf16, Causal::none, Sparsity::block_sparse, 64), {}, 90).block_m() == 64);
  CHECK(path_on_h100(256, Causal::none, Sparsity::block_sparse, 32) == AttentionPath::wgmma);
  CHECK(path_on_h100(32, Causal::none, Sparsity::block_sparse, 32) == AttentionPath::mma);
  CHECK(path_on_h100(96, Causal::none, Sparsity::dense, 0) == AttentionPath::wgmma_ws);
  CHECK(path_on_h100(96, Causal::top_left, Sparsity::block_sparse, 128) == AttentionPath::wgmma_ws);
  CHECK(path_on_h100(96, Causal::none, Sparsity::block_sparse, 64) == AttentionPath::wgmma);
  CHECK(path_on_h100(32, Causal::none, Sparsity::dense, 0) == AttentionPath::mma);
}

TEST_CASE("resolve() fills every unset field and the result is a valid tiling for every spec", "[attention][config]") {
  for (int d : kHeadDims)
    for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right})
      for (Sparsity sparsity : {Sparsity::dense, Sparsity::block_sparse, Sparsity::baked})
        for (int bs : kBlockSizes) {
          const AttentionSpec spec = make_spec(d, DType::bf16, causal, sparsity, bs, 1);
          CAPTURE(key(spec));
          const AttentionConfig c = resolve(spec, {});
          CHECK((c.warps == 4 || c.warps == 8));
          CHECK((c.m_tiles == 1 || c.m_tiles == 2));
          CHECK((c.block_n == 16 || c.block_n == 32 || c.block_n == 64 || c.block_n == 128));
          CHECK((c.stages == 2 || c.stages == 3));
          CHECK((c.q_in_registers == 0 || c.q_in_registers == 1));
          CHECK(c.block_m() == 16 * c.m_tiles * c.warps);
          CHECK(resolve(spec, c) == c);  // a resolved config is a fixed point
          CHECK(parse_attention_config(key(c)) == c);
        }
}

TEST_CASE("resolve() keeps the fields that are set", "[attention][config]") {
  const AttentionSpec spec = make_spec(64, DType::f16, Causal::none, Sparsity::dense, 0);
  const AttentionConfig c = resolve(spec, {8, 0, 128, 0, -1});
  CHECK(c.warps == 8);
  CHECK(c.block_n == 128);
  CHECK(c.m_tiles != 0);
  CHECK(c.stages != 0);
  CHECK(c.q_in_registers != -1);
}

TEST_CASE("resolve() refuses bad tilings, naming the field", "[attention][config]") {
  const AttentionSpec d64 = make_spec(64, DType::f16, Causal::none, Sparsity::dense, 0);
  CHECK_THROWS_AS(resolve(d64, {3, 0, 0, 0, -1}), InvalidArgument);
  CHECK_THROWS_WITH(resolve(d64, {3, 0, 0, 0, -1}), Contains("warps = 3"));
  CHECK_THROWS_WITH(resolve(d64, {0, 3, 0, 0, -1}), Contains("mt = 3"));
  CHECK_THROWS_WITH(resolve(d64, {0, 0, 48, 0, -1}), Contains("bn = 48"));
  CHECK_THROWS_WITH(resolve(d64, {0, 0, 0, 4, -1}), Contains("stages = 4"));
  CHECK_THROWS_WITH(resolve(d64, {0, 0, 0, 0, 2}), Contains("qreg = 2"));
  SECTION("too much shared memory") {
    const AttentionSpec d256 = make_spec(256, DType::bf16, Causal::none, Sparsity::dense, 0);
    CHECK_THROWS_AS(resolve(d256, {8, 2, 128, 3, 0}), InvalidArgument);
    CHECK_THROWS_WITH(resolve(d256, {8, 2, 128, 3, 0}), Contains("shared memory"));
    // Q tile + stages * (K + V) tiles of padded rows: (256 + 2*3*128) * (256 + 8) * 2 bytes, far over 227 KB;
    // the same tiling at d = 32 needs (256 + 768) * 40 * 2 = 80 KB and is fine.
    CHECK_NOTHROW(resolve(make_spec(32, DType::bf16, Causal::none, Sparsity::dense, 0), {8, 2, 128, 3, 0}));
  }
  SECTION("more than 64 pattern blocks in one tile") {
    // A 256 x 128 tile over 16 x 16 blocks holds 16 * 8 = 128 of them: the mask is one 64-bit word.
    const AttentionSpec bs16 = make_spec(64, DType::f16, Causal::none, Sparsity::block_sparse, 16);
    CHECK_THROWS_AS(resolve(bs16, {8, 2, 128, 2, 0}), InvalidArgument);
    CHECK_THROWS_WITH(resolve(bs16, {8, 2, 128, 2, 0}), Contains("pattern blocks") && Contains("64"));
    // 256 x 64 over 16 x 16 is 64 blocks: fits. The same tile over 32 x 32 blocks holds 16.
    CHECK_NOTHROW(resolve(bs16, {8, 2, 64, 2, 0}));
    CHECK_NOTHROW(resolve(make_spec(64, DType::f16, Causal::none, Sparsity::block_sparse, 32), {8, 2, 128, 2, 0}));
    // Dense kernels have no tile mask: any tile shape that fits shared memory goes.
    CHECK_NOTHROW(resolve(d64, {8, 2, 128, 2, 0}));
  }
}

// ---------------------------------------------------------------------------------------------------
// 3. The block-sparse tile schedule, element by element
// ---------------------------------------------------------------------------------------------------

namespace {

struct NamedPattern {
  std::string what;
  BlockPattern pattern;
};

// Patterns of every kind the builders make, with element lengths that end inside a block, shared by
// every head (heads 1) and per head (heads 3). Sizes keep the element-by-element check to ~ a second.
std::vector<NamedPattern> schedule_patterns(std::mt19937_64& rng, int bs) {
  const int max_blocks = bs == 16 ? 20 : bs == 32 ? 12 : bs == 64 ? 8 : 6;
  auto length = [&] {  // elements: 1 .. max_blocks blocks, the last one usually partial
    const std::int64_t blocks = 1 + std::int64_t(rng() % max_blocks);
    return (blocks - 1) * bs + 1 + std::int64_t(rng() % bs);
  };
  std::vector<NamedPattern> out;
  for (int heads : {1, 3}) {
    std::int64_t sq = length(), sk = length();
    const std::uint64_t seed = rng();
    const double density = double(rng() % 1001) / 1000.0;
    out.push_back({fmt::format("random(density {}, seed {})", density, seed),
                   patterns::random(bs, sq, sk, density, seed, heads)});
    sq = length(), sk = length();
    const int local = int(rng() % 3), global = int(rng() % 2), random_blocks = int(rng() % 3);
    out.push_back({fmt::format("bigbird({}, {}, {}, seed {})", local, global, random_blocks, seed),
                   patterns::bigbird(bs, sq, sk, local, global, random_blocks, seed, heads)});
    sq = length(), sk = length();
    out.push_back({"causal top-left", patterns::causal(bs, sq, sk, CausalAlign::top_left, heads)});
    sq = length(), sk = length();
    out.push_back({"causal bottom-right", patterns::causal(bs, sq, sk, CausalAlign::bottom_right, heads)});
    // Any mask at all: empty rows, full rows, holes next to active blocks.
    const std::int64_t rows = 1 + std::int64_t(rng() % max_blocks), cols = 1 + std::int64_t(rng() % max_blocks);
    std::vector<std::uint8_t> mask(std::size_t(heads * rows * cols));
    const unsigned fill = unsigned(rng() % 4);  // a quarter .. all of the blocks
    for (auto& m : mask) m = (rng() % 4) <= fill;
    out.push_back({"random block mask", BlockPattern::from_block_mask(bs, heads, rows, cols, mask)});
  }
  out.push_back({"dense", patterns::dense(bs, 3 * bs - 5, 5 * bs + 1, 2)});
  out.push_back({"empty", patterns::random(bs, 2 * bs, 4 * bs, 0.0, 1, 1)});
  return out;
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// Checks the schedule's structure, then every (head, query, key) element of the pattern's blocks:
// the pattern allows it iff its item lists its key tile with the element's bit (or the whole tile).
// The bit is (row_local / group_rows) * (block_n / group_cols) + col_local / group_cols, with group sides
// min(block size, tile side), as the kernel's mask_tile reads it.
void check_schedule(const BlockPattern& p, int block_m, int block_n) {
  const attention::TileSchedule s = attention::build_tile_schedule(p, block_m, block_n);
  const int bs = p.block_size();
  const std::int64_t query_rows = p.block_rows() * bs, keys = p.block_cols() * bs;
  const std::int64_t q_tiles = ceil_div(query_rows, block_m), key_tiles = ceil_div(keys, block_n);
  const std::int64_t items = p.heads() * q_tiles;

  REQUIRE(s.pattern_heads == p.heads());
  REQUIRE(s.q_tiles == q_tiles);
  REQUIRE(s.item_tile_begin.size() == std::size_t(items + 1));
  REQUIRE(s.item_tile_begin.front() == 0);
  REQUIRE(s.item_tile_begin.back() == std::int64_t(s.tile_index.size()));
  REQUIRE(s.tile_mask.size() == s.tile_index.size());
  REQUIRE(s.tiles() == std::int64_t(s.tile_index.size()));
  CHECK(attention::count_active_tiles(p, block_m, block_n) == s.tiles());
  const std::vector<std::int32_t> each_item = attention::active_tiles_each_item(p, block_m, block_n);
  REQUIRE(each_item.size() == std::size_t(items));
  for (std::int64_t item = 0; item < items; ++item) {
    const std::int32_t begin = s.item_tile_begin[item], end = s.item_tile_begin[item + 1];
    REQUIRE(begin <= end);
    CHECK(each_item[std::size_t(item)] == end - begin);
    for (std::int32_t t = begin; t < end; ++t) {
      REQUIRE(s.tile_index[t] >= 0);
      REQUIRE(s.tile_index[t] < key_tiles);
      if (t > begin) REQUIRE(s.tile_index[t - 1] < s.tile_index[t]);  // ascending, no repeats
    }
  }

  // The launch order: a permutation of the items, heaviest first.
  REQUIRE(s.item_order.size() == std::size_t(items));
  std::vector<std::int32_t> sorted = s.item_order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int32_t> all(items);
  std::iota(all.begin(), all.end(), 0);
  CHECK(sorted == all);
  auto count = [&](std::int32_t item) { return s.item_tile_begin[item + 1] - s.item_tile_begin[item]; };
  for (std::size_t r = 1; r < s.item_order.size(); ++r) {
    CAPTURE(r);
    REQUIRE(count(s.item_order[r - 1]) >= count(s.item_order[r]));
  }
  // The key-major pass's order: each head's items (their q_tile) a permutation of its own, heaviest first.
  REQUIRE(s.head_item_order.size() == std::size_t(items));
  for (int head = 0; head < s.pattern_heads; ++head) {
    CAPTURE(head);
    const auto first = s.head_item_order.begin() + std::int64_t(head) * s.q_tiles;
    std::vector<std::int32_t> own(first, first + s.q_tiles);
    for (int r = 1; r < s.q_tiles; ++r)
      REQUIRE(count(head * s.q_tiles + own[r - 1]) >= count(head * s.q_tiles + own[r]));
    std::sort(own.begin(), own.end());
    std::vector<std::int32_t> tiles(s.q_tiles);
    std::iota(tiles.begin(), tiles.end(), 0);
    CHECK(own == tiles);
  }

  // The pattern expanded from active(), one byte per block.
  std::vector<std::uint8_t> active(std::size_t(p.heads() * p.block_rows() * p.block_cols()));
  for (int h = 0; h < p.heads(); ++h)
    for (std::int64_t r = 0; r < p.block_rows(); ++r)
      for (std::int64_t c = 0; c < p.block_cols(); ++c)
        active[(h * p.block_rows() + r) * p.block_cols() + c] = p.active(h, r, c);

  const int group_rows = std::min(bs, block_m), group_cols = std::min(bs, block_n);
  const int groups_per_tile_row = block_n / group_cols;
  std::int64_t mismatches = 0;
  std::string first_mismatch;
  std::vector<std::int32_t> position(key_tiles);  // key tile -> its index in tile_index, or -1
  std::vector<std::uint8_t> tile_used(s.tile_index.size(), 0);
  for (int h = 0; h < p.heads(); ++h)
    for (std::int64_t i = 0; i < query_rows; ++i) {
      const std::int64_t item = h * q_tiles + i / block_m;
      if (i % block_m == 0) {
        std::fill(position.begin(), position.end(), -1);
        for (std::int32_t t = s.item_tile_begin[item]; t < s.item_tile_begin[item + 1]; ++t)
          position[s.tile_index[t]] = t;
      }
      const int row_local = int(i % block_m);
      const std::uint8_t* block_row = &active[(h * p.block_rows() + i / bs) * p.block_cols()];
      for (std::int64_t j = 0; j < keys; ++j) {
        const bool allowed = block_row[j / bs] != 0;
        const std::int32_t at = position[j / block_n];
        bool listed = false;
        if (at >= 0) {
          const int col_local = int(j % block_n);
          const int bit = (row_local / group_rows) * groups_per_tile_row + col_local / group_cols;
          listed = s.tile_mask[at] == sjit_kernels::kWholeTile || ((s.tile_mask[at] >> bit) & 1u);
          if (allowed) tile_used[at] = 1;
        }
        if (allowed != listed && mismatches++ == 0)
          first_mismatch = fmt::format("head {} query {} key {}: pattern {}, schedule {}", h, i, j,
                                       allowed ? "allows" : "refuses", listed ? "computes" : "skips");
      }
    }
  CAPTURE(first_mismatch);
  CHECK(mismatches == 0);
  // Nothing wasted: every listed tile holds an element the pattern allows.
  CHECK(std::count(tile_used.begin(), tile_used.end(), 0) == 0);
}

}  // namespace

TEST_CASE("the tile schedule computes exactly the elements the pattern allows", "[attention][schedule]") {
  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  int shapes_checked = 0;
  for (int bs : kBlockSizes)
    for (const NamedPattern& np : schedule_patterns(rng, bs))
      for (int block_m : {64, 128, 256})
        for (int block_n : {16, 32, 64, 128}) {
          const int groups = (block_m / std::min(bs, block_m)) * (block_n / std::min(bs, block_n));
          if (groups > 64) continue;  // resolve() refuses these tiles
          CAPTURE(bs, np.what, np.pattern.heads(), np.pattern.block_rows(), np.pattern.block_cols(), block_m, block_n);
          check_schedule(np.pattern, block_m, block_n);
          ++shapes_checked;
        }
  CHECK(shapes_checked > 300);
}

// Pattern blocks of 16 and 32: which patterns take the wide tiles (attention/wide_tiles.h).
TEST_CASE("small pattern blocks: the wide tiling, and which patterns take it", "[attention][schedule][config]") {
  for (const int d : kHeadDims)
    for (const int bs : kBlockSizes)
      for (const Sparsity sparsity : {Sparsity::dense, Sparsity::block_sparse, Sparsity::baked}) {
        const AttentionSpec spec = make_spec(d, DType::bf16, Causal::none, sparsity, bs, 1);
        CAPTURE(key(spec));
        const std::optional<AttentionConfig> wide = attention::wide_tile_config(spec);
        const bool chooses = sparsity == Sparsity::block_sparse && bs <= 32 && d != 32;  // d = 32: no wgmma
        REQUIRE(wide.has_value() == chooses);
        if (!wide) continue;
        // The persistent kernel, or at d = 256, which it does not take, the one-item kernel.
        CHECK(wide->path == (d == 256 ? AttentionPath::wgmma : AttentionPath::wgmma_ws));
        CHECK(wide->block_m() == 128);
        CHECK(wide->block_n == (d == 256 ? 64 : 128));
        CHECK(resolve(spec, *wide, 90) == *wide);  // a tiling the kernel takes, every field set
      }

  const std::int64_t seq = 4096;
  auto pays = [&](int d, int bs, const BlockPattern& p) {
    const AttentionSpec spec = make_spec(d, DType::bf16, Causal::none, Sparsity::block_sparse, bs);
    return attention::wide_tiles_pay(spec, p, default_config(spec, 90));
  };
  // Random blocks: a dense-ish pattern fills every 128 x 128 tile, a sparse one leaves most of them
  // empty while its 64-row tiles stay few.
  for (const int bs : {16, 32}) {
    CAPTURE(bs);
    CHECK(pays(128, bs, patterns::random(bs, seq, seq, 0.5, 3)));
    CHECK_FALSE(pays(128, bs, patterns::random(bs, seq, seq, 0.05, 3)));
    CHECK_FALSE(pays(128, bs, patterns::random(bs, seq, seq, 0.0, 3)));
  }
  // Blocks of 32 lose less a score on the narrow tiles: they stay there up to about 0.4.
  CHECK_FALSE(pays(128, 32, patterns::random(32, seq, seq, 0.3, 3)));
  CHECK(pays(128, 32, patterns::random(32, seq, seq, 0.6, 3)));
  CHECK(pays(128, 16, patterns::random(16, seq, seq, 0.3, 3)));
  CHECK_FALSE(pays(64, 32, patterns::random(32, seq, seq, 0.3, 3)));
  CHECK(pays(64, 32, patterns::random(32, seq, seq, 0.7, 3)));
  CHECK(pays(256, 16, patterns::random(16, seq, seq, 0.25, 3)));
  CHECK_FALSE(pays(256, 16, patterns::random(16, seq, seq, 0.05, 3)));
  // The tiles decide, not the density: a band of 16 blocks of 16 (6% of the blocks) fills the wide
  // tiles along the diagonal and takes them; random blocks at that density do not.
  const BlockPattern band = patterns::sliding_window(16, seq, seq, 8, 7);
  REQUIRE(band.stats().density < 0.07);
  CHECK(pays(128, 16, band));
  CHECK_FALSE(pays(128, 16, patterns::random(16, seq, seq, band.stats().density, 3)));
  // A spec without the choice never pays.
  CHECK_FALSE(attention::wide_tiles_pay(make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, 64),
                                        patterns::random(64, seq, seq, 0.9, 3), {}));
}

// Pattern blocks of 16: which patterns take the gathered-key kernel over the narrow tiles
// (attention/gathered_keys.h).
TEST_CASE("blocks of 16: the gathered-key tiling, and which patterns take it", "[attention][schedule][config]") {
  for (const int d : kHeadDims)
    for (const int bs : kBlockSizes)
      for (const Sparsity sparsity : {Sparsity::dense, Sparsity::block_sparse, Sparsity::baked}) {
        const AttentionSpec spec = make_spec(d, DType::bf16, Causal::none, sparsity, bs, 1);
        CAPTURE(key(spec));
        for (const int heads : {1, 2, 4}) {
          CAPTURE(heads);
          const std::optional<AttentionConfig> gathered = attention::gathered_config(spec, heads);
          // Blocks of 16 with 1, 2 or 4 heads a CTA, blocks of 32 with 2 (64 columns at most; one head
          // of 32 was slower than the narrow tiles everywhere), at d = 64, 96 and 128.
          const bool takes = bs == 16 || (bs == 32 && heads == 2);
          const bool chooses = sparsity == Sparsity::block_sparse && takes && (d == 64 || d == 96 || d == 128);
          REQUIRE(gathered.has_value() == chooses);
          if (!gathered) continue;
          CHECK(gathered->path == AttentionPath::wgmma_gather);
          CHECK(gathered->block_m() == bs);  // an item is one query block
          CHECK(gathered->m_tiles == heads);
          CHECK(resolve(spec, *gathered, 90) == *gathered);
        }
      }

  auto pays = [](int d, Causal causal, const BlockPattern& p) {
    const AttentionSpec spec = make_spec(d, DType::bf16, causal, Sparsity::block_sparse, 16);
    return attention::gathering_pays(spec, p, default_config(spec, 90));
  };
  // Random blocks with enough of them a row: the narrow tiles would compute 3-4 times the active
  // scores. At S = 8192 density 0.02 is 10 blocks a row (taken), at S = 4096 5 (not: an item's fixed
  // cost).
  CHECK(pays(128, Causal::none, patterns::random(16, 8192, 8192, 0.1, 3)));
  CHECK(pays(64, Causal::none, patterns::random(16, 4096, 4096, 0.1, 3)));
  CHECK(pays(128, Causal::none, patterns::random(16, 8192, 8192, 0.02, 3)));
  CHECK_FALSE(pays(128, Causal::none, patterns::random(16, 4096, 4096, 0.02, 3)));
  // Under a causal mask a row keeps half its blocks: 0.02 at S = 8192 no longer pays, 0.1 still does.
  CHECK_FALSE(pays(128, Causal::top_left, patterns::random(16, 8192, 8192, 0.02, 3)));
  CHECK(pays(128, Causal::top_left, patterns::random(16, 8192, 8192, 0.1, 3)));
  // Blocks that neighbouring rows share fill the narrow tiles: a sliding window never pays, and
  // neither does an empty pattern or a spec without the choice.
  CHECK_FALSE(pays(128, Causal::none, patterns::sliding_window(16, 8192, 8192, 64, 63)));
  CHECK_FALSE(pays(128, Causal::none, patterns::random(16, 4096, 4096, 0.0, 3)));
  CHECK_FALSE(pays(256, Causal::none, patterns::random(16, 8192, 8192, 0.1, 3)));

  // Query heads that share the pattern and a K/V head read each block once for all of them: the most
  // of 4 and 2 that divide the group, with a pattern of one head.
  const AttentionSpec s16 = make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, 16);
  const AttentionSpec s32 = make_spec(128, DType::bf16, Causal::none, Sparsity::block_sparse, 32);
  const BlockPattern shared = patterns::random(16, 4096, 4096, 0.1, 3);
  CHECK(attention::gathered_heads(s16, shared, 16, 4) == 4);
  CHECK(attention::gathered_heads(s16, shared, 16, 8) == 2);
  CHECK(attention::gathered_heads(s16, shared, 16, 16) == 1);
  CHECK(attention::gathered_heads(s16, patterns::random(16, 4096, 4096, 0.1, 3, 16), 16, 4) == 1);  // per head
  CHECK(attention::gathered_heads(s32, patterns::random(32, 4096, 4096, 0.1, 3), 16, 4) == 2);  // 64 columns
  auto pays_with = [](const AttentionSpec& spec, const BlockPattern& p, int heads) {
    return attention::gathering_pays(spec, p, default_config(spec, 90), heads);
  };
  // With 4 heads, blocks of 16 beat the wide tiles at 0.25 (one head does not: there the wide tiles,
  // decided first, take the pattern) but not at 0.5; with 2, blocks of 32 beat the narrow tiles at 0.1
  // and 0.25, not where rows hold few blocks.
  CHECK(pays_with(s16, patterns::random(16, 8192, 8192, 0.25, 3), 4));
  CHECK(attention::wide_tiles_pay(s16, patterns::random(16, 8192, 8192, 0.25, 3), default_config(s16, 90)));
  CHECK_FALSE(pays_with(s16, patterns::random(16, 8192, 8192, 0.5, 3), 4));
  CHECK(pays_with(s32, patterns::random(32, 8192, 8192, 0.1, 3), 2));
  CHECK(pays_with(s32, patterns::random(32, 8192, 8192, 0.25, 3), 2));
  CHECK_FALSE(pays_with(s32, patterns::random(32, 8192, 8192, 0.02, 3), 2));
  CHECK_FALSE(pays_with(s32, patterns::random(32, 8192, 8192, 0.6, 3), 2));
  CHECK_FALSE(pays_with(s32, patterns::random(32, 8192, 8192, 0.1, 3), 1));
}

TEST_CASE("the backward packs query blocks of random sparse patterns, not of windows or dense-ish ones",
          "[attention][schedule]") {
  const std::int64_t seq = 4096;
  auto pays = [&](const BlockPattern& p) { return attention::packing_queries_pays(128, p, 128, 64); };
  for (const int bs : {16, 32}) {
    CAPTURE(bs);
    // A 64-query tile holds 64 / bs query blocks; a CTA's 128 keys see a random one with probability
    // 1 - (1 - density)^(128 / bs), a tile with 1 - (1 - density)^(2 * 128 / bs).
    CHECK(pays(patterns::random(bs, seq, seq, 0.1, 5)));
    CHECK(pays(patterns::random(bs, seq, seq, 0.02, 5)));
    CHECK_FALSE(pays(patterns::random(bs, seq, seq, 0.5, 5)));
    // A window's blocks fill the contiguous tiles they lie in: packing would visit as many.
    CHECK_FALSE(pays(patterns::sliding_window(bs, seq, seq, 256 / bs, 0)));
  }
  CHECK(pays(patterns::random(16, seq, seq, 0.25, 5)));   // 0.90 of the tiles: measured 5-9% faster
  CHECK_FALSE(pays(patterns::random(32, seq, seq, 0.5, 5)));
  // 128-query tiles (d = 64): a packed run costs less against a wider tile, up to 0.97 of them.
  auto pays_wide = [&](const BlockPattern& p) { return attention::packing_queries_pays(64, p, 128, 128); };
  CHECK(pays_wide(patterns::random(16, seq, seq, 0.3, 5)));        // 0.945
  CHECK_FALSE(pays_wide(patterns::random(16, seq, seq, 0.4, 5)));  // 0.98
  CHECK(pays_wide(patterns::random(32, seq, seq, 0.55, 5)));       // 0.96
  CHECK_FALSE(pays_wide(patterns::random(32, seq, seq, 0.7, 5)));  // 0.99
  CHECK_FALSE(pays_wide(patterns::sliding_window(16, seq, seq, 16, 15)));  // 0.975
  // Blocks as wide as the tile, or wider, have nothing to pack.
  CHECK_FALSE(pays(patterns::random(64, seq, seq, 0.1, 5)));
  CHECK_FALSE(pays(patterns::random(128, seq, seq, 0.1, 5)));
  // Nothing active: no tile either way.
  CHECK_FALSE(pays(patterns::random(32, seq, seq, 0.0, 5)));
}

// A 64-query walk counts the tiles a CTA would walk packed, its last one whole: windows whose queries
// would pack to 0.85-0.92 of the contiguous tiles fill as many whole tiles, and were measured slower
// packed at d = 64 and 128 (packed_queries.cpp). In brackets: queries packed over 64 / whole tiles,
// over the contiguous tiles.
TEST_CASE("the backward packs a 64-query walk only where it saves whole tiles", "[attention][schedule]") {
  // One key tile of 128 keys (8 blocks of 16) that sees 5 query blocks: 80 queries fill two 64-query
  // tiles packed, as many as the contiguous ones they lie in (blocks 0 and 4-7), so packing pays
  // nothing; 4 blocks spread over 3 tiles pack into one.
  auto one_column = [](const std::vector<int>& query_blocks) {
    std::vector<std::uint8_t> mask(16 * 16, 0);  // 16 query blocks by 16 key blocks; key block 0 only
    for (const int q : query_blocks) mask[std::size_t(q) * 16] = 1;
    return BlockPattern::from_block_mask(16, 1, 16, 16, mask);
  };
  CHECK_FALSE(attention::packing_queries_pays(128, one_column({0, 4, 5, 6, 7}), 128, 64));
  CHECK(attention::packing_queries_pays(128, one_column({0, 4, 8, 9}), 128, 64));
  const std::int64_t seq = 4096;
  for (const int head_dim : {64, 128}) {
    CAPTURE(head_dim);
    auto pays = [&](const BlockPattern& p) { return attention::packing_queries_pays(head_dim, p, 128, 64); };
    CHECK_FALSE(pays(patterns::sliding_window(16, seq, seq, 5, 4)));  // 0.85 / 1.0
    CHECK_FALSE(pays(patterns::sliding_window(32, seq, seq, 2, 1)));  // 0.88 / 1.0
    CHECK_FALSE(pays(patterns::sliding_window(32, seq, seq, 3, 2)));  // 0.90 / 1.0
    CHECK_FALSE(pays(patterns::sliding_window(32, seq, seq, 4, 3)));  // 0.92 / 1.0
    CHECK(pays(patterns::random(32, seq, seq, 0.3, 7)));              // 0.81
  }
  // At d = 64 blocks of 16 pack below 0.8 (0.2 measured 3% slower packed, 0.15 2-5% faster); at d = 128
  // up to 0.92 (0.25 measured 5-9% faster).
  auto pays_at = [&](int head_dim, const BlockPattern& p) { return attention::packing_queries_pays(head_dim, p, 128, 64); };
  CHECK(pays_at(64, patterns::random(16, seq, seq, 0.15, 7)));        // 0.73
  CHECK_FALSE(pays_at(64, patterns::random(16, seq, seq, 0.2, 7)));   // 0.84
  CHECK_FALSE(pays_at(64, patterns::sliding_window(16, seq, seq, 6, 5)));  // 0.84
  CHECK(pays_at(128, patterns::random(16, seq, seq, 0.2, 7)));
  CHECK(pays_at(128, patterns::random(16, seq, seq, 0.25, 7)));       // 0.91
  // On 128-query tiles the measure stays in queries: those windows of blocks of 16 pack there (measured
  // 7-13% faster with four heads a K/V head).
  CHECK(attention::packing_queries_pays(64, patterns::sliding_window(16, seq, seq, 5, 4), 128, 128));  // 0.71
  CHECK(attention::packing_queries_pays(64, patterns::sliding_window(16, seq, seq, 6, 5), 128, 128));  // 0.79
}

// On 128-query tiles a window's runs lie end to end, and packing only trims its walks' ends: it paid
// below 0.85 of the queries with one or two query heads a K/V head and below 0.94 with four or more,
// where random patterns, whose runs skip holes, pay up to 0.97 whatever the group (packed_queries.cpp).
TEST_CASE("on 128-query tiles a window packs below a share that grows with the query heads a K/V head",
          "[attention][schedule]") {
  const std::int64_t seq = 4096;
  auto pays = [&](const BlockPattern& p, std::int64_t group) {
    return attention::packing_queries_pays(64, p, 128, 128, group);
  };
  const BlockPattern b32_6 = patterns::sliding_window(32, seq, seq, 6, 5);    // 0.76: 10-18% faster packed
  const BlockPattern b32_4 = patterns::sliding_window(32, seq, seq, 4, 3);    // 0.92
  const BlockPattern b16_8 = patterns::sliding_window(16, seq, seq, 8, 7);    // 0.96
  const BlockPattern b32_12 = patterns::sliding_window(32, seq, seq, 12, 11); // 0.97
  for (const std::int64_t group : {1, 2, 4, 8}) {
    CAPTURE(group);
    CHECK(pays(b32_6, group));
    CHECK(pays(b32_4, group) == (group >= 4));  // one head 5% slower packed, two 2%, four 4% faster
    CHECK_FALSE(pays(b16_8, group));            // 6-8% slower packed with two and four heads
    CHECK_FALSE(pays(b32_12, group));
    // Random blocks keep their share: 0.945 packs, 0.98 not.
    CHECK(pays(patterns::random(16, seq, seq, 0.3, 5), group));
    CHECK_FALSE(pays(patterns::random(16, seq, seq, 0.4, 5), group));
  }
  // A random pattern whose every 128-query tile is active makes a band of tiles, but not of runs.
  CHECK(attention::contiguous_walks(patterns::random(16, seq, seq, 0.3, 5), 128, 128).banded);
  CHECK_FALSE(attention::contiguous_walks(patterns::random(16, seq, seq, 0.3, 5), 128, 16).banded);
  CHECK(attention::contiguous_walks(b16_8, 128, 16).banded);
  // 64-query tiles count whole tiles, whatever the group (a window fills as many packed).
  CHECK_FALSE(attention::packing_queries_pays(64, b32_4, 128, 64, 4));
}

// The dQ rule's count (attention::contiguous_walks): the contiguous tiles of the key-major walks, packed
// or not, and whether they make a band, each key tile's query tiles one run meeting the next one's.
TEST_CASE("contiguous walks count the tiles a packed walk lies in, and windows make a band, random blocks not",
          "[attention][schedule]") {
  const std::int64_t seq = 4096;
  for (const int block : {16, 32, 64, 128}) {
    CAPTURE(block);
    for (const auto& [before, after] : {std::pair{0, 0}, {1, 0}, {5, 4}, {6, 5}, {12, 0}}) {
      CAPTURE(before, after);
      const BlockPattern window = patterns::sliding_window(block, seq, seq, before, after, 2);
      const attention::ContiguousWalks walks = attention::contiguous_walks(window, 128, 64);
      CHECK(walks.banded);
      CHECK(walks.tiles == attention::count_active_tiles(window.transposed(), 128, 64));
    }
    // A causal pattern's key tiles see every query from the diagonal on: a band too.
    CHECK(attention::contiguous_walks(patterns::causal(block, seq, seq), 128, 64).banded);
    // (Random rows of one block are the diagonal, a band; blocks of 16 at 0.5 fill every tile, and walk
    // as a dense pattern, also a band.)
    for (const double density : {0.05, 0.1}) {
      CAPTURE(density);
      const BlockPattern random = patterns::random(block, seq, seq, density, 11);
      const attention::ContiguousWalks walks = attention::contiguous_walks(random, 128, 64);
      CHECK_FALSE(walks.banded);
      CHECK(walks.tiles == attention::count_active_tiles(random.transposed(), 128, 64));
    }
  }
  // A window of blocks of 16 lies in more contiguous tiles than its packed runs fill: 6 + 1 + 5 blocks
  // are 192 queries a key block, 2.35 tiles of 64 a row packed at S = 8192, 2.97 contiguous.
  const BlockPattern window = patterns::sliding_window(16, 8192, 8192, 6, 5);
  const double packed = double(attention::count_active_tiles(window.transposed(), 128, 16)) * 16 / 8192;
  const double contiguous = double(attention::contiguous_walks(window, 128, 64).tiles) * 64 / 8192;
  CHECK(packed == Approx(2.35).margin(0.01));
  CHECK(contiguous == Approx(2.97).margin(0.01));
  // Each key tile's walk one run, but far from its neighbour's (key block c sees query block 15 - c:
  // the anti-diagonal's runs meet only in the middle), or two runs: no band.
  std::vector<std::uint8_t> anti(32 * 32, 0), split(32 * 32, 0);
  for (int c = 0; c < 32; ++c) anti[std::size_t((c * 7) % 32) * 32 + c] = 1;
  for (int c = 0; c < 32; ++c) split[std::size_t(c) * 32 + c] = split[std::size_t((c + 16) % 32) * 32 + c] = 1;
  CHECK_FALSE(attention::contiguous_walks(BlockPattern::from_block_mask(128, 1, 32, 32, anti), 128, 64).banded);
  CHECK_FALSE(attention::contiguous_walks(BlockPattern::from_block_mask(128, 1, 32, 32, split), 128, 64).banded);
  // The empty pattern walks nothing, and is no band.
  const attention::ContiguousWalks none = attention::contiguous_walks(patterns::random(64, seq, seq, 0.0, 1), 128, 64);
  CHECK(none.tiles == 0);
  CHECK_FALSE(none.banded);
}

// The thresholds are the measured crossovers (packed_queries.cpp); each case sits on one side of one
// (the ratio of the 128-key CTAs' scores to the gathered steps' is in the comment).
TEST_CASE("the backward gathers the blocks of sparse random patterns of 16 and 32, not of windows or dense-ish ones",
          "[attention][schedule]") {
  const std::int64_t seq = 8192;
  auto pays = [&](int head_dim, const BlockPattern& p, Causal causal = Causal::none) {
    AttentionSpec spec;
    spec.head_dim = head_dim;
    spec.causal = causal;
    spec.sparsity = Sparsity::block_sparse;
    spec.block_size = p.block_size();
    // (The 128-key CTAs' tiles: 128 queries at d = 64.)
    return attention::gathering_queries_pays(spec, p, 128, head_dim == 64 ? 128 : 64, false);
  };
  // d = 128: blocks of 16 from 0.1 (5.6) down, not at 0.25 (3.6); blocks of 32 from 0.1 (3.4), not at
  // 0.25 (2.7).
  CHECK(pays(128, patterns::random(16, seq, seq, 0.1, 7)));
  CHECK(pays(128, patterns::random(16, seq, seq, 0.02, 7)));  // 10 blocks a key block's column
  CHECK_FALSE(pays(128, patterns::random(16, seq, seq, 0.25, 7)));
  CHECK(pays(128, patterns::random(32, seq, seq, 0.1, 7)));
  CHECK_FALSE(pays(128, patterns::random(32, seq, seq, 0.25, 7)));
  // Too few blocks a column for a CTA's fixed costs: blocks of 32 at 0.02 (5), blocks of 16 at 0.02
  // under a causal mask (about 5 left of 10).
  CHECK_FALSE(pays(128, patterns::random(32, seq, seq, 0.02, 7)));
  CHECK_FALSE(pays(128, patterns::random(16, seq, seq, 0.02, 7), Causal::top_left));
  CHECK(pays(128, patterns::random(16, seq, seq, 0.1, 7), Causal::top_left));
  // d = 64, whose 128-key CTAs walk 128-query tiles: blocks of 16 at 0.25 (3.6), not at 0.3 (3.1);
  // blocks of 32 at 0.5 (1.86), not at 0.55 (1.74).
  CHECK(pays(64, patterns::random(16, seq, seq, 0.25, 7)));
  CHECK_FALSE(pays(64, patterns::random(16, seq, seq, 0.3, 7)));
  CHECK(pays(64, patterns::random(32, seq, seq, 0.25, 7)));
  CHECK(pays(64, patterns::random(32, seq, seq, 0.5, 7)));
  CHECK_FALSE(pays(64, patterns::random(32, seq, seq, 0.55, 7)));
  for (const int bs : {16, 32}) {
    CAPTURE(bs);
    // A window's blocks fill the 128-key CTAs' tiles (1.2).
    CHECK_FALSE(pays(64, patterns::sliding_window(bs, seq, seq, 256 / bs, 0)));
    CHECK_FALSE(pays(64, patterns::random(bs, seq, seq, 0.0, 7)));  // nothing to walk
  }
  CHECK_FALSE(pays(64, patterns::random(128, seq, seq, 0.1, 7)));  // blocks as wide as a CTA's keys
}

// Blocks of 64: a 128-key CTA walks the union of its two blocks' query tiles, the gathered pass
// (attention_backward_sm90_key_block.cuh) each block's own (packed_queries.cpp has the measurements).
TEST_CASE("the backward gathers sparse random blocks of 64 at d = 64 and 96, and at d = 128 with the dQ pass",
          "[attention][schedule]") {
  const std::int64_t seq = 8192;
  auto pays = [&](int head_dim, const BlockPattern& p, bool by_pass) {
    AttentionSpec spec;
    spec.head_dim = head_dim;
    spec.sparsity = Sparsity::block_sparse;
    spec.block_size = 64;
    return attention::gathering_queries_pays(spec, p, 128, 64, by_pass);
  };
  const BlockPattern sparse = patterns::random(64, seq, seq, 0.1, 7);        // scores ratio 1.9
  const BlockPattern quarter = patterns::random(64, seq, seq, 0.25, 7);      // 1.75
  const BlockPattern half = patterns::random(64, seq, seq, 0.5, 7);          // 1.5
  const BlockPattern window = patterns::sliding_window(64, seq, seq, 4, 3);  // 1.1
  for (const int d : {64, 96}) {
    CAPTURE(d);
    CHECK(pays(d, sparse, false));
    CHECK(pays(d, quarter, false));
    CHECK_FALSE(pays(d, window, false));
  }
  // At 0.5 where the 128-key CTAs would sum dQ by their pass (d = 64), not against their atomic dQ (96).
  CHECK(pays(64, half, false));
  CHECK_FALSE(pays(96, half, false));
  // d = 128 with atomic dQ: the 128-key CTAs tie it; with the dQ pass it wins.
  CHECK_FALSE(pays(128, sparse, false));
  CHECK(pays(128, sparse, true));
  CHECK(pays(128, half, true));
  CHECK_FALSE(pays(128, window, true));
  // Too few blocks a key block's column for a CTA's fixed costs: 0.02 (about 3).
  CHECK_FALSE(pays(64, patterns::random(64, seq, seq, 0.02, 7), false));
}

// d = 64's dK/dV pass takes 64-query tiles where a CTA walks fewer 128-query tiles than
// min_wide_tiles_a_walk (measured on sliding windows: packed_queries.cpp); each case sits on one side.
TEST_CASE("at d = 64 the backward walks short windows of blocks of 16 and 32 on 64-query tiles, long walks on 128",
          "[attention][schedule]") {
  const std::int64_t seq = 4096;
  auto narrow = [](const BlockPattern& p, std::int64_t group = 1) {
    return attention::narrow_query_tiles_pay(p, 128, group);
  };
  // Blocks of 16: a window of B blocks before and A after the diagonal gives a 128-key CTA's 8 blocks
  // 8 + B + A query blocks, (8 + B + A) / 8 tiles of 128: below 4.5 up to 12 + 11, not from 16 + 15.
  CHECK(narrow(patterns::sliding_window(16, seq, seq, 4, 3)));    // 1.9
  CHECK(narrow(patterns::sliding_window(16, seq, seq, 8, 7)));    // 2.9
  CHECK(narrow(patterns::sliding_window(16, seq, seq, 12, 11)));  // 3.9
  CHECK_FALSE(narrow(patterns::sliding_window(16, seq, seq, 16, 15)));  // 4.9
  CHECK_FALSE(narrow(patterns::sliding_window(16, seq, seq, 24, 23)));  // 6.9
  // Blocks of 32 (4 a CTA): below 2.25 at 2 + 1, not at 4 + 3 or 12 + 11.
  CHECK(narrow(patterns::sliding_window(32, seq, seq, 2, 1)));          // 1.75
  CHECK_FALSE(narrow(patterns::sliding_window(32, seq, seq, 4, 3)));    // 2.75
  CHECK_FALSE(narrow(patterns::sliding_window(32, seq, seq, 12, 11)));  // 6.75
  // A CTA walks every query head of its K/V head, so groups spread its fixed costs over longer walks:
  // the crossover a head falls, measured with 2, 4 and 8 heads. Blocks of 16: 4 + 1 + 3 (1.9) stays
  // narrow, 5 + 1 + 4 (2.1) goes wide.
  for (const std::int64_t group : {2, 4, 8}) {
    CAPTURE(group);
    CHECK(narrow(patterns::sliding_window(16, seq, seq, 4, 3), group));
    CHECK_FALSE(narrow(patterns::sliding_window(16, seq, seq, 5, 4), group));
    CHECK_FALSE(narrow(patterns::sliding_window(16, seq, seq, 6, 5), group));
    CHECK_FALSE(narrow(patterns::sliding_window(16, seq, seq, 8, 7), group));
    CHECK_FALSE(narrow(patterns::sliding_window(16, seq, seq, 6, 5, 8), group));  // a pattern a head
  }
  // Blocks of 32: 2 + 1 + 1 (1.75) narrow with 2 heads, wide with 4 and 8; 3 + 1 + 2 (2.25) wide with 2.
  CHECK(narrow(patterns::sliding_window(32, seq, seq, 2, 1), 2));
  CHECK_FALSE(narrow(patterns::sliding_window(32, seq, seq, 3, 2), 2));
  CHECK_FALSE(narrow(patterns::sliding_window(32, seq, seq, 2, 1), 4));
  CHECK_FALSE(narrow(patterns::sliding_window(32, seq, seq, 2, 1), 8));
  // Random patterns: long walks at these densities (a CTA's keys see most query blocks).
  for (const int bs : {16, 32}) {
    CAPTURE(bs);
    CHECK_FALSE(narrow(patterns::random(bs, seq, seq, 0.5, 3)));
    CHECK_FALSE(narrow(patterns::random(bs, seq, seq, 0.1, 3)));
    // A pattern per head counts every head's walks.
    CHECK(narrow(patterns::sliding_window(bs, seq, seq, 64 / bs, 0, 4)));
    // Nothing active: no walk is long.
    CHECK(narrow(patterns::random(bs, seq, seq, 0.0, 3)));
  }
}

TEST_CASE("SJIT_BACKWARD_WALK forces a walk where it exists, and a bad value is refused", "[attention][schedule]") {
  AttentionSpec spec;
  spec.head_dim = 128;
  spec.sparsity = Sparsity::block_sparse;
  spec.block_size = 16;
  const BlockPattern sparse = patterns::random(16, 4096, 4096, 0.1, 7);
  using attention::QueryWalk;
  auto walk = [&](const BlockPattern& p, bool gathers, std::string_view forced, bool by_pass = false) {
    return attention::choose_query_walk(spec, p, 128, 64, 1, gathers, by_pass, forced);
  };
  CHECK(walk(sparse, true, "") == QueryWalk::gathered);  // the rule (ratio 5.6)
  CHECK(walk(sparse, true, "auto") == QueryWalk::gathered);
  // No gathered pass (or a call that asked for query tiles but no walk): packing's rule.
  CHECK(walk(sparse, false, "") == QueryWalk::packed);
  CHECK(walk(sparse, true, "tiles") == QueryWalk::tiles);
  CHECK(walk(sparse, true, "packed") == QueryWalk::packed);
  CHECK(walk(sparse, false, "gathered") == QueryWalk::packed);  // no gathered pass for the spec
  // The names Attention::backward_walk's answers go by are the values that force them.
  for (const BackwardWalk w : {BackwardWalk::tiles, BackwardWalk::packed, BackwardWalk::gathered}) {
    CAPTURE(name(w));
    CHECK(walk(sparse, true, name(w)) == w);
  }
  const BlockPattern window = patterns::sliding_window(16, 4096, 4096, 16, 0);
  CHECK(walk(window, true, "") == QueryWalk::tiles);
  CHECK(walk(window, true, "gathered") == QueryWalk::gathered);
  const BlockPattern wide = patterns::random(128, 4096, 4096, 0.1, 7);  // nothing narrower than a CTA's keys
  CHECK(walk(wide, true, "gathered") == QueryWalk::tiles);
  CHECK(walk(wide, true, "packed") == QueryWalk::tiles);
  // Blocks of 64: as wide as the tiles (nothing to pack), narrower than a CTA's 128 keys.
  spec.block_size = 64;
  const BlockPattern blocks_of_64 = patterns::random(64, 4096, 4096, 0.1, 7);
  CHECK(walk(blocks_of_64, true, "gathered") == QueryWalk::gathered);
  CHECK(walk(blocks_of_64, true, "packed") == QueryWalk::tiles);
  CHECK(walk(blocks_of_64, false, "gathered") == QueryWalk::tiles);
  // Unforced at d = 128: gathered only where the gathered backward would sum dQ by its pass.
  CHECK(walk(blocks_of_64, true, "") == QueryWalk::tiles);
  CHECK(walk(blocks_of_64, true, "", true) == QueryWalk::gathered);
  CHECK(walk(blocks_of_64, true, "auto", true) == QueryWalk::gathered);
  CHECK(walk(blocks_of_64, false, "", true) == QueryWalk::tiles);  // query tiles asked, no walk
  CHECK_THROWS_WITH(walk(wide, true, "gather"), Catch::Matchers::Contains("SJIT_BACKWARD_WALK = 'gather'"));
  // The variable itself, read by every backward (also of blocks of 128, where no walk is chosen).
  const char* saved = std::getenv("SJIT_BACKWARD_WALK");
  const std::string saved_value = saved ? saved : "";
  ::setenv("SJIT_BACKWARD_WALK", "gatherd", 1);
  CHECK_THROWS_WITH(attention::forced_query_walk(), Catch::Matchers::Contains("SJIT_BACKWARD_WALK = 'gatherd'") &&
                                                        Catch::Matchers::Contains("tiles, packed, gathered or auto"));
  ::setenv("SJIT_BACKWARD_WALK", "packed", 1);
  CHECK(attention::forced_query_walk() == "packed");
  ::unsetenv("SJIT_BACKWARD_WALK");
  CHECK(attention::forced_query_walk().empty());
  if (saved) ::setenv("SJIT_BACKWARD_WALK", saved_value.c_str(), 1);
  CHECK_THROWS_WITH(walk(sparse, true, "gather"),
                    Catch::Matchers::Contains("SJIT_BACKWARD_WALK = 'gather'") &&
                        Catch::Matchers::Contains("tiles, packed, gathered or auto"));
}

TEST_CASE("SJIT_BACKWARD_QUERY_TILES forces d = 64's dK/dV tiles, and a bad value is refused",
          "[attention][schedule]") {
  const char* saved = std::getenv("SJIT_BACKWARD_QUERY_TILES");
  const std::string saved_value = saved ? saved : "";
  ::unsetenv("SJIT_BACKWARD_QUERY_TILES");
  CHECK_FALSE(attention::forced_query_tile_cols().has_value());
  ::setenv("SJIT_BACKWARD_QUERY_TILES", "auto", 1);
  CHECK_FALSE(attention::forced_query_tile_cols().has_value());
  ::setenv("SJIT_BACKWARD_QUERY_TILES", "64", 1);
  CHECK(attention::forced_query_tile_cols() == 64);
  ::setenv("SJIT_BACKWARD_QUERY_TILES", "128", 1);
  CHECK(attention::forced_query_tile_cols() == 128);
  for (const char* bad : {"96", "narrow", " 64", "64 "}) {
    CAPTURE(bad);
    ::setenv("SJIT_BACKWARD_QUERY_TILES", bad, 1);
    CHECK_THROWS_WITH(attention::forced_query_tile_cols(),
                      Catch::Matchers::Contains(fmt::format("SJIT_BACKWARD_QUERY_TILES = '{}'", bad)) &&
                          Catch::Matchers::Contains("use 64, 128 or auto"));
  }
  if (saved) ::setenv("SJIT_BACKWARD_QUERY_TILES", saved_value.c_str(), 1);
  else ::unsetenv("SJIT_BACKWARD_QUERY_TILES");
}

TEST_CASE("the tile schedule of small hand-made patterns", "[attention][schedule]") {
  SECTION("a 128-block pattern over 64 x 32 tiles: each active block is 2 x 4 whole tiles") {
    // Blocks (0,1) and (1,0) of a 2 x 2 pattern.
    const std::uint8_t mask[] = {0, 1, 1, 0};
    const BlockPattern p = BlockPattern::from_block_mask(128, 1, 2, 2, mask);
    const attention::TileSchedule s = attention::build_tile_schedule(p, 64, 32);
    CHECK(s.q_tiles == 4);
    CHECK(s.item_tile_begin == std::vector<std::int32_t>{0, 4, 8, 12, 16});
    CHECK(s.tile_index == std::vector<std::int32_t>{4, 5, 6, 7, 4, 5, 6, 7, 0, 1, 2, 3, 0, 1, 2, 3});
    for (std::uint64_t m : s.tile_mask) CHECK(m == sjit_kernels::kWholeTile);
  }
  SECTION("a 16-block pattern inside one 64 x 32 tile: one bit per block, row-major over the 4 x 2 groups") {
    // 4 x 2 blocks, the diagonal ones active: (0,0) -> bit 0, (1,1) -> bit 3.
    const std::uint8_t mask[] = {1, 0, 0, 1, 0, 0, 0, 0};
    const BlockPattern p = BlockPattern::from_block_mask(16, 1, 4, 2, mask);
    const attention::TileSchedule s = attention::build_tile_schedule(p, 64, 32);
    CHECK(s.tile_index == std::vector<std::int32_t>{0});
    CHECK(s.tile_mask == std::vector<std::uint64_t>{0b1001});
  }
  SECTION("an empty row lists no tile and comes last in the launch order") {
    const std::uint8_t mask[] = {0, 0, 1, 1};
    const BlockPattern p = BlockPattern::from_block_mask(64, 1, 2, 2, mask);
    const attention::TileSchedule s = attention::build_tile_schedule(p, 64, 64);
    CHECK(s.item_tile_begin == std::vector<std::int32_t>{0, 0, 2});
    CHECK(s.item_order == std::vector<std::int32_t>{1, 0});
  }
}

// ---------------------------------------------------------------------------------------------------
// 4. FLOP counts
// ---------------------------------------------------------------------------------------------------

namespace {

// 4 * D * batch * |{(head, i, j) : attention_allows}|, the pattern expanded element by element.
double brute_force_flops(const AttentionSpec& spec, const AttentionForwardArgs& a) {
  reference::AttentionProblem p;
  p.batch = a.batch, p.heads_q = a.heads_q, p.heads_kv = a.heads_kv, p.seq_q = a.seq_q, p.seq_k = a.seq_k;
  p.head_dim = spec.head_dim;
  p.causal = spec.causal != Causal::none;
  p.causal_bottom_right = spec.causal == Causal::bottom_right;
  if (a.pattern != nullptr) {
    const BlockPattern& pattern = *a.pattern;
    p.filter = [&pattern](std::int64_t h, std::int64_t i, std::int64_t j) {
      const int bs = pattern.block_size();
      return pattern.active(pattern.heads() == 1 ? 0 : int(h), i / bs, j / bs);
    };
  }
  std::int64_t allowed = 0;
  for (std::int64_t h = 0; h < a.heads_q; ++h)
    for (std::int64_t i = 0; i < a.seq_q; ++i)
      for (std::int64_t j = 0; j < a.seq_k; ++j) allowed += reference::attention_allows(p, h, i, j);
  return 4.0 * spec.head_dim * double(a.batch) * double(allowed);
}

AttentionForwardArgs shape(std::int64_t batch, std::int64_t heads_q, std::int64_t seq_q, std::int64_t seq_k,
                           const BlockPattern* pattern = nullptr) {
  AttentionForwardArgs a;
  a.batch = batch, a.heads_q = heads_q, a.heads_kv = 1, a.seq_q = seq_q, a.seq_k = seq_k;
  a.pattern = pattern;
  return a;
}

}  // namespace

TEST_CASE("attention_forward_flops counts 4 D flops per allowed (query, key) pair", "[attention][flops]") {
  SECTION("dense: 4 D B H Sq Sk") {
    const AttentionSpec spec = make_spec(64, DType::bf16, Causal::none, Sparsity::dense, 0);
    const AttentionForwardArgs a = shape(3, 2, 37, 53);
    CHECK(attention_forward_flops(spec, a) == 4.0 * 64 * 3 * 2 * 37 * 53);
    CHECK(attention_forward_flops(spec, a) == brute_force_flops(spec, a));
  }
  SECTION("causal, both alignments, square and not, queries longer than keys") {
    for (Causal causal : {Causal::top_left, Causal::bottom_right})
      for (auto [sq, sk] : std::vector<std::pair<int, int>>{{64, 64}, {37, 91}, {91, 37}, {1, 100}, {100, 1}}) {
        const AttentionSpec spec = make_spec(128, DType::f16, causal, Sparsity::dense, 0);
        const AttentionForwardArgs a = shape(2, 3, sq, sk);
        CAPTURE(key(spec), sq, sk);
        CHECK(attention_forward_flops(spec, a) == brute_force_flops(spec, a));
      }
    // Top-left, square: half the matrix plus the diagonal.
    const AttentionSpec tl = make_spec(32, DType::f16, Causal::top_left, Sparsity::dense, 0);
    CHECK(attention_forward_flops(tl, shape(1, 1, 10, 10)) == 4.0 * 32 * 55);
  }
  SECTION("block-sparse, shared and per-head patterns, with and without causality") {
    std::mt19937_64 rng(test::fresh_seed());
    for (int bs : {16, 32, 64})
      for (int heads : {1, 3})
        for (Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
          const std::int64_t sq = 1 + std::int64_t(rng() % (5 * bs)), sk = 1 + std::int64_t(rng() % (5 * bs));
          const std::uint64_t seed = rng();
          const BlockPattern pattern = rng() % 2 ? patterns::random(bs, sq, sk, 0.5, seed, heads)
                                                 : patterns::bigbird(bs, sq, sk, 1, 1, 1, seed, heads);
          const AttentionSpec spec = make_spec(64, DType::bf16, causal, Sparsity::block_sparse, bs);
          const AttentionForwardArgs a = shape(2, 3, sq, sk, &pattern);
          CAPTURE(key(spec), sq, sk, heads, seed);
          CHECK(attention_forward_flops(spec, a) == brute_force_flops(spec, a));
        }
  }
}

// ---------------------------------------------------------------------------------------------------
// 5. Argument checks before any GPU work
// ---------------------------------------------------------------------------------------------------

namespace {

void* fake(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

// Valid arguments at fake, far-apart, 16-byte-aligned addresses: B=2, Hq=4, Hkv=2, Sq=100, Sk=130, D=64.
// Each tensor is at most 2*4*130*64*2 bytes = 0x20800, well under the 1 MiB between them.
AttentionForwardArgs fake_args() {
  AttentionForwardArgs a;
  a.q = fake(0x100000);
  a.k = fake(0x200000);
  a.v = fake(0x300000);
  a.o = fake(0x400000);
  a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.seq_q = 100, a.seq_k = 130;
  return a;
}

// forward() with arguments that pass every check: here, without a GPU, the device is what fails.
// With a GPU the fake pointers must not reach a kernel, so there is nothing to run.
void check_accepted(Attention& attention, const AttentionForwardArgs& a) {
  if (gpu_available()) return;
  try {
    attention.forward(a);
    FAIL("forward() without a GPU returned instead of throwing NoDevice");
  } catch (const InvalidArgument& e) {
    FAIL(fmt::format("valid arguments were refused: {}", e.what()));
  } catch (const Error&) {
    SUCCEED();
  }
}

}  // namespace

TEST_CASE("Attention::forward refuses bad arguments before any GPU work, naming the argument", "[attention][args]") {
  const AttentionSpec dense = make_spec(64, DType::f16, Causal::none, Sparsity::dense, 0);
  Attention attention(dense);
  check_accepted(attention, fake_args());

  auto refused = [&](Attention& att, const AttentionForwardArgs& a, const std::string& text) {
    CAPTURE(text);
    CHECK_THROWS_AS(att.forward(a), InvalidArgument);
    CHECK_THROWS_WITH(att.forward(a), Contains(text));
    CHECK_THROWS_WITH(att.prepare_forward(a), Contains(text));
  };
  SECTION("null pointers") {
    for (const char* which : {"q", "k", "v", "o"}) {
      AttentionForwardArgs a = fake_args();
      if (which[0] == 'q') a.q = nullptr;
      if (which[0] == 'k') a.k = nullptr;
      if (which[0] == 'v') a.v = nullptr;
      if (which[0] == 'o') a.o = nullptr;
      refused(attention, a, fmt::format("{} is null", which));
    }
  }
  SECTION("misaligned pointers") {
    AttentionForwardArgs a = fake_args();
    a.k = fake(0x200008);
    refused(attention, a, "k = 0x200008");
    a = fake_args();
    a.o = fake(0x400002);
    refused(attention, a, "o = 0x400002");
    a = fake_args();
    a.lse = static_cast<float*>(fake(0x500002));
    refused(attention, a, "lse");
  }
  SECTION("query heads not a multiple of key/value heads") {
    AttentionForwardArgs a = fake_args();
    a.heads_q = 6, a.heads_kv = 4;
    refused(attention, a, "heads_q = 6");
    CHECK_THROWS_WITH(attention.forward(a), Contains("heads_kv = 4"));
  }
  SECTION("strides") {
    AttentionForwardArgs a = fake_args();
    a.q_strides = {4 * 100 * 100, 100 * 100, 100};
    refused(attention, a, "q row stride = 100");
    a = fake_args();
    a.v_strides = {2 * 130 * 64, 130 * 64 + 4, 64};
    refused(attention, a, "v head stride");
    a = fake_args();
    a.k_strides = {2 * 130 * 64, 130 * 64, 32};  // rows of 64 elements 32 apart
    refused(attention, a, "k row stride = 32");
  }
  SECTION("sizes out of range") {
    AttentionForwardArgs a = fake_args();
    a.seq_q = -1;
    refused(attention, a, "seq_q = -1");
    a = fake_args();
    a.seq_k = -5;
    refused(attention, a, "seq_k = -5");
    a = fake_args();
    a.batch = -2;
    refused(attention, a, "batch = -2");
    a = fake_args();
    a.heads_q = 0;
    refused(attention, a, "heads_q = 0");
  }
  SECTION("scale") {
    AttentionForwardArgs a = fake_args();
    a.scale = std::numeric_limits<float>::quiet_NaN();
    refused(attention, a, "scale = nan");
    a.scale = -0.5f;
    refused(attention, a, "scale = -0.5");
    a.scale = std::numeric_limits<float>::infinity();
    refused(attention, a, "scale = inf");
  }
  SECTION("the last round's mode") {
    AttentionForwardArgs a = fake_args();
    a.last_round = static_cast<LastRound>(7);
    refused(attention, a, "last_round = 7");
    CHECK(parse_last_round("split") == LastRound::split);
    CHECK(parse_last_round(name(LastRound::whole)) == LastRound::whole);
    CHECK_THROWS_WITH(parse_last_round("halves"), Catch::Matchers::Contains("last round 'halves' is unknown"));
  }
  SECTION("o overlapping k or v") {
    AttentionForwardArgs a = fake_args();
    a.o = fake(0x200000 + 0x1000);
    refused(attention, a, "o overlaps k");
    a.o = fake(0x300000 - 0x100);  // ends inside v
    refused(attention, a, "o overlaps v");
    a.o = fake(0x100000);  // o may alias q: every tile reads its q rows before writing them
    check_accepted(attention, a);
  }
  SECTION("several query heads a CTA on the gathered-key kernel: a shared pattern and whole K/V groups") {
    const AttentionSpec bs16 = make_spec(64, DType::f16, Causal::none, Sparsity::block_sparse, 16);
    AttentionConfig two_heads{4, 2, 16, 2, 0, AttentionPath::wgmma_gather}, four_heads = two_heads;
    four_heads.m_tiles = 4;
    Attention gathered(bs16, two_heads), gathered4(bs16, four_heads);
    const BlockPattern shared = patterns::random(16, 100, 130, 0.5, 7, 1);
    const BlockPattern per_head = patterns::random(16, 100, 130, 0.5, 7, 4);
    AttentionForwardArgs a = fake_args();  // 4 query heads, 2 a K/V head
    a.pattern = &per_head;
    refused(gathered, a, "the pattern has 4 heads (1 is needed)");
    a.pattern = &shared;
    refused(gathered4, a, "a K/V head has 2 query heads (a multiple of 4 is needed)");
    check_accepted(gathered, a);
  }
  SECTION("a pattern given to a dense spec") {
    const BlockPattern p = patterns::dense(64, 100, 130);
    AttentionForwardArgs a = fake_args();
    a.pattern = &p;
    refused(attention, a, "pattern");
    CHECK_THROWS_WITH(attention.forward(a), Contains("dense"));
  }
}

// The backward, prepare_backward and what they would run (dq_summation, backward_tiling, backward_walk)
// check their arguments as the forward does, before any GPU work: the same fake tensors plus dO, lse
// and the three gradients, each 1 MiB apart.
TEST_CASE("Attention::backward, prepare_backward and dq_summation refuse bad arguments, naming the argument",
          "[attention][args]") {
  auto backward_args = [] {
    AttentionBackwardArgs b;
    const AttentionForwardArgs f = fake_args();
    b.q = f.q, b.k = f.k, b.v = f.v, b.o = f.o;
    b.d_o = fake(0x500000), b.lse = static_cast<float*>(fake(0x600000));
    b.dq = fake(0x700000), b.dk = fake(0x800000), b.dv = fake(0x900000);
    b.batch = f.batch, b.heads_q = f.heads_q, b.heads_kv = f.heads_kv, b.seq_q = f.seq_q, b.seq_k = f.seq_k;
    return b;
  };
  auto refused = [](Attention& att, const AttentionBackwardArgs& b, const std::string& text) {
    CAPTURE(text);
    CHECK_THROWS_AS(att.backward(b), InvalidArgument);
    CHECK_THROWS_WITH(att.backward(b), Contains(text));
    CHECK_THROWS_WITH(att.dq_summation(b), Contains(text));
    CHECK_THROWS_WITH(att.backward_tiling(b), Contains(text));
    CHECK_THROWS_WITH(att.backward_walk(b), Contains(text));
    CHECK_THROWS_WITH(att.prepare_backward(b), Contains(text));
  };
  Attention dense(make_spec(64, DType::f16, Causal::none, Sparsity::dense, 0));
  AttentionBackwardArgs b = backward_args();
  b.lse = nullptr;
  refused(dense, b, "lse is null");
  b = backward_args();
  b.d_o = nullptr;
  refused(dense, b, "d_o");
  b = backward_args();
  b.dk = fake(0x200000 + 0x1000);  // inside k
  refused(dense, b, "dk overlaps k");
  b = backward_args();
  b.heads_q = 6, b.heads_kv = 4;
  refused(dense, b, "heads_q = 6");
  b = backward_args();
  b.query_tile_cols = 96;
  refused(dense, b, "query_tile_cols = 96: use 64 or 128");
  b.query_tile_cols = -64;
  refused(dense, b, "query_tile_cols = -64");
  b = backward_args();
  b.walk = static_cast<BackwardWalk>(7);
  refused(dense, b, "walk = 7: not a BackwardWalk");

  Attention sparse(make_spec(64, DType::f16, Causal::none, Sparsity::block_sparse, 64));
  b = backward_args();
  refused(sparse, b, "needs args.pattern");
  const BlockPattern wrong_shape = patterns::dense(64, 200, 130);  // 4 block rows where Sq = 100 needs 2
  b.pattern = &wrong_shape;
  CHECK_THROWS_AS(sparse.backward(b), InvalidArgument);
  CHECK_THROWS_AS(sparse.dq_summation(b), InvalidArgument);
  CHECK_THROWS_AS(sparse.backward_walk(b), InvalidArgument);
  CHECK_THROWS_AS(sparse.prepare_backward(b), InvalidArgument);
}

TEST_CASE("Attention::forward checks the pattern against the spec and the shapes", "[attention][args]") {
  const AttentionSpec bsr = make_spec(64, DType::bf16, Causal::none, Sparsity::block_sparse, 32);
  Attention attention(bsr);
  auto refused = [&](const AttentionForwardArgs& a, const std::string& text) {
    CAPTURE(text);
    CHECK_THROWS_AS(attention.forward(a), InvalidArgument);
    CHECK_THROWS_WITH(attention.forward(a), Contains(text));
  };
  // Sq = 100, Sk = 130 with 32-blocks: 4 x 5 blocks.
  const BlockPattern good = patterns::random(32, 100, 130, 0.5, 7, 4);
  AttentionForwardArgs a = fake_args();
  a.pattern = &good;
  check_accepted(attention, a);
  const BlockPattern shared = patterns::random(32, 100, 130, 0.5, 7, 1);
  a.pattern = &shared;
  check_accepted(attention, a);

  SECTION("no pattern") {
    a.pattern = nullptr;
    refused(a, "pattern");
  }
  SECTION("wrong block size") {
    const BlockPattern p = patterns::random(64, 100, 130, 0.5, 7, 1);
    a.pattern = &p;
    refused(a, "block size 64");
  }
  SECTION("wrong block shape") {
    const BlockPattern rows = patterns::random(32, 129, 130, 0.5, 7, 1);  // 5 x 5
    a.pattern = &rows;
    refused(a, "5 x 5");
    const BlockPattern cols = patterns::random(32, 100, 128, 0.5, 7, 1);  // 4 x 4
    a.pattern = &cols;
    refused(a, "4 x 4");
  }
  SECTION("head count neither 1 nor heads_q") {
    const BlockPattern p = patterns::random(32, 100, 130, 0.5, 7, 2);  // heads_kv, not heads_q
    a.pattern = &p;
    refused(a, "2 heads");
  }
}

TEST_CASE("Attention::forward_config and prepare(pattern) check the pattern against the spec", "[attention][args]") {
  const AttentionSpec bsr = make_spec(64, DType::bf16, Causal::none, Sparsity::block_sparse, 32);
  Attention attention(bsr);
  const BlockPattern p64 = patterns::random(64, 100, 130, 0.5, 7, 1);
  CHECK_THROWS_WITH(attention.forward_config(p64), Contains("block size 64") && Contains("made for 32"));
  CHECK_THROWS_WITH(attention.prepare(p64), Contains("block size 64"));
  Attention dense(make_spec(64, DType::bf16, Causal::none, Sparsity::dense, 0));
  const BlockPattern p32 = patterns::random(32, 100, 130, 0.5, 7, 1);
  CHECK_THROWS_WITH(dense.forward_config(p32), Contains("dense spec") && Contains("sparsity=bsr"));
  CHECK_THROWS_WITH(dense.prepare(p32), Contains("dense spec"));
  // A pattern with every block active runs on the dense kernels, with their tiling.
  AttentionSpec dense_of_bsr = bsr;
  dense_of_bsr.sparsity = Sparsity::dense;
  CHECK(attention.forward_config(patterns::dense(32, 100, 130)) == Attention(dense_of_bsr).config());
  if (!gpu_available() || current_device().cc_major != 9) {
    // Off Hopper every other pattern runs on config().
    CHECK(attention.forward_config(p32) == attention.config());
    CHECK(attention.forward_config(patterns::random(32, 2048, 2048, 0.9, 7, 1)) == attention.config());
  }
  // A baked object runs its own pattern.
  const BlockPattern baked_pattern = patterns::random(32, 100, 130, 0.5, 9, 1);
  Attention baked(bsr, baked_pattern);
  CHECK(baked.forward_config(baked_pattern) == baked.config());
  CHECK_THROWS_WITH(baked.forward_config(p32), Contains("not the one baked"));
  // A tiling asked for is always the one run.
  AttentionConfig mma;
  mma.path = AttentionPath::mma;
  Attention asked(bsr, mma);
  CHECK(asked.forward_config(patterns::random(32, 2048, 2048, 0.9, 7, 1)) == asked.config());
}

TEST_CASE("a baked Attention takes its own pattern or none, and no other", "[attention][args]") {
  // Sq = 100, Sk = 130 with 64-blocks: 2 x 3 blocks.
  const std::uint8_t baked_mask[] = {1, 0, 1, 0, 1, 0}, other_mask[] = {1, 1, 0, 0, 1, 0};
  const BlockPattern baked = BlockPattern::from_block_mask(64, 1, 2, 3, baked_mask);
  Attention attention(make_spec(64, DType::f16, Causal::none, Sparsity::dense, 0), baked);
  CHECK(attention.spec().sparsity == Sparsity::baked);
  CHECK(attention.spec().block_size == 64);
  CHECK(attention.spec().pattern_digest == baked.digest());

  AttentionForwardArgs a = fake_args();
  check_accepted(attention, a);  // null: the baked pattern
  const BlockPattern same = baked;
  a.pattern = &same;
  check_accepted(attention, a);
  const BlockPattern other = BlockPattern::from_block_mask(64, 1, 2, 3, other_mask);
  REQUIRE(!(other == baked));
  a.pattern = &other;
  CHECK_THROWS_AS(attention.forward(a), InvalidArgument);
  CHECK_THROWS_WITH(attention.forward(a), Contains("pattern") && Contains(fmt::format("{:016x}", other.digest())));
  SECTION("and its shape is checked against the sequence lengths") {
    a = fake_args();
    a.seq_k = 300;
    CHECK_THROWS_WITH(attention.forward(a), Contains("seq_k = 300"));
  }
}

TEST_CASE("an empty batch or query set returns before touching the GPU", "[attention][args]") {
  const BlockPattern p = patterns::random(32, 100, 130, 0.5, 7, 1);
  for (Sparsity sparsity : {Sparsity::dense, Sparsity::block_sparse}) {
    Attention attention(make_spec(64, DType::f16, Causal::top_left, sparsity, 32));
    AttentionForwardArgs a = fake_args();
    if (sparsity == Sparsity::block_sparse) a.pattern = &p;
    CAPTURE(key(attention.spec()));
    a.batch = 0;
    CHECK_NOTHROW(attention.forward(a));
    a = fake_args();
    a.seq_q = 0;
    a.pattern = nullptr;  // no query: not even the pattern is needed
    CHECK_NOTHROW(attention.forward(a));
  }
  // The checks still run first: an empty batch with a null q is refused.
  Attention attention(make_spec(64, DType::f16, Causal::none, Sparsity::dense, 0));
  AttentionForwardArgs a = fake_args();
  a.batch = 0;
  a.q = nullptr;
  CHECK_THROWS_WITH(attention.forward(a), Contains("q is null"));
}

// ---------------------------------------------------------------------------------------------------
// 6. NVRTC compiles (no GPU needed)
// ---------------------------------------------------------------------------------------------------

namespace {

// The process cache turned off while this lives, so that every compile runs NVRTC and reports its usage.
struct CacheOff {
  CacheSettings saved = cache_settings();
  CacheOff() { set_cache_settings({saved.dir, CacheMode::off, saved.max_bytes}); }
  ~CacheOff() { set_cache_settings(saved); }
};

}  // namespace

TEST_CASE("the generated attention unit is an include and a Cfg struct", "[attention][codegen]") {
  const std::string src = source_for_key("attention:d=128,dtype=bf16");
  CHECK_THAT(src, Contains("#include \"sparsejit/attention_forward.cuh\""));
  CHECK_THAT(src, Contains("struct Cfg"));
  CHECK_THAT(src, Contains("using T = __nv_bfloat16;"));
  CHECK_THAT(src, Contains("head_dim = 128;"));
  CHECK_THAT(src, !Contains("__global__"));
  CHECK(std::count(src.begin(), src.end(), '\n') < 25);
  CHECK_THAT(source_for_key("attention:d=64,dtype=f16,sparsity=bsr,block=32|warps=8,mt=1,bn=16,stages=3,qreg=1"),
             Contains("using T = __half;") && Contains("warps = 8;") && Contains("block_n = 16;") &&
                 Contains("stages = 3;") && Contains("pattern_block = 32;"));
}

TEST_CASE("a baked key cannot be compiled from its text alone", "[attention][codegen]") {
  const std::string baked = "attention:d=64,dtype=f16,sparsity=baked,block=64,pattern=0123456789abcdef";
  CHECK_THROWS_AS(source_for_key(baked), InvalidSpec);
  CHECK_THROWS_WITH(source_for_key(baked), Contains("baked") && Contains("BlockPattern"));
  CHECK_THROWS_AS(compile_key(baked, "sm_90a"), InvalidSpec);
}

TEST_CASE("attention kernels compile with NVRTC for sm_90a and sm_80", "[attention][codegen][nvrtc]") {
  CacheOff no_cache;
  struct Job {
    std::string key, arch;
  };
  const std::vector<Job> jobs = {
      {"attention:d=128,dtype=bf16", "sm_90a"},
      {"attention:d=64,dtype=f16,causal=br,sparsity=bsr,block=32", "sm_90a"},
      {"attention:d=64,dtype=f16,causal=br,sparsity=bsr,block=32", "sm_80"},
      {"attention:d=256,causal=tl", "sm_80"},
      {"attention:d=128,dtype=bf16|warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma", "sm_90a"},
      {"attention:d=64,dtype=f16,causal=br,sparsity=bsr,block=32|warps=4,mt=1,bn=128,stages=3,qreg=0,path=wgmma",
       "sm_90a"},
      {"attention:d=128,dtype=bf16,sparsity=bsr,block=128|warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma_ws", "sm_90a"},
      // An item's first S in registers of their own (d = 64 with 128-key tiles; d = 128 puts it in o's).
      {"attention:d=64,dtype=bf16,sparsity=bsr,block=128|warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma_ws", "sm_90a"},
      {"attention:d=64,dtype=f16,causal=tl|warps=4,mt=1,bn=64,stages=3,qreg=0,path=wgmma_ws", "sm_90a"},
      // d = 96 (tiles in whole swizzle blocks) and d = 256 (64 x 256 products) on their default kernels.
      {"attention:d=96,dtype=bf16,causal=tl|warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma_ws", "sm_90a"},
      {"attention:d=256,dtype=f16,sparsity=bsr,block=128|warps=8,mt=1,bn=64,stages=2,qreg=0,path=wgmma", "sm_90a"},
      // The gathered-key kernel (blocks of 16 and 32; its products transposed, N = 16 and 32).
      {"attention:d=128,dtype=bf16,sparsity=bsr,block=16|warps=4,mt=1,bn=16,stages=2,qreg=0,path=wgmma_gather",
       "sm_90a"},
      {"attention:d=96,dtype=f16,causal=br,sparsity=bsr,block=32|warps=4,mt=1,bn=32,stages=2,qreg=0,path=wgmma_gather",
       "sm_90a"},
  };
  // Two at a time: CI has two cores.
  for (std::size_t first = 0; first < jobs.size(); first += 2) {
    std::vector<std::future<CompiledKernel>> compiled;
    for (std::size_t i = first; i < std::min(first + 2, jobs.size()); ++i)
      compiled.push_back(std::async(std::launch::async, [job = jobs[i]] { return compile_key(job.key, job.arch); }));
    for (std::size_t n = 0; n < compiled.size(); ++n) {
      const Job& job = jobs[first + n];
      CAPTURE(job.key, job.arch);
      const CompiledKernel k = compiled[n].get();
      CHECK_FALSE(k.from_cache);
      CHECK(k.arch == job.arch);
      CHECK(k.binary.size() > 1000);
      CHECK(k.binary.compare(0, 4, "\x7f" "ELF") == 0);  // a CUBIN is an ELF file
      CHECK(k.usage.registers > 0);
      if (job.key.find("d=64") != std::string::npos || job.key.find("wgmma") != std::string::npos)
        CHECK(k.usage.spill_store_bytes == 0);
      // No wgmma of the Hopper kernels serialized by ptxas (its "are serialized" notes, C7514-C7520),
      // but in the persistent kernel with one math warpgroup (warps=4, never the default), which is as
      // it stands (docs/attention.md, "What is left").
      if (job.key.find("warps=4") == std::string::npos || job.key.find("wgmma_ws") == std::string::npos)
        CHECK_THAT(k.log, !Contains("are serialized"));
      // The persistent kernel's two math warpgroups take registers from the copy warpgroup
      // (setmaxnreg): that needs the launch's full share of 65536 / 384 (168) a thread.
      if (job.key.find("warps=8,mt=1,bn=128,stages=2,qreg=0,path=wgmma_ws") != std::string::npos)
        CHECK(k.usage.registers == 168);
    }
  }
}

TEST_CASE("a wgmma kernel refuses a target without sm_90a features, saying why", "[attention][codegen][nvrtc]") {
  CacheOff no_cache;
  const std::string key = "attention:d=64,dtype=bf16|warps=4,mt=1,bn=64,stages=2,qreg=0,path=wgmma";
  CHECK_THAT(source_for_key(key), Contains("attention_forward_sm90.cuh") && Contains("block_n = 64;"));
  CHECK_THROWS_WITH(compile_key(key, "sm_80"), Contains("sm_90a"));
}
