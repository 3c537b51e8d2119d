// Attention tuning without a GPU: the shape buckets, the candidate grid, and the hook through which an
// Attention built with an all-unset config takes the stored winner (docs/tuning.md, "Attention").
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "sparsejit/sparsejit.h"
#include "codegen/embedded_templates.h"
#include "support/run_tool.h"
#include "support/temp_dir.h"
#include "tune/attention_tuned_configs.h"
#include "tune/tuned_configs.h"
#include "tune/tuner_support.h"
#include "tune/tuning_db.h"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {

AttentionSpec dense_spec(int head_dim) {
  AttentionSpec s;
  s.head_dim = head_dim;
  return s;
}

AttentionSpec bsr_spec(int head_dim, int block) {
  AttentionSpec s = dense_spec(head_dim);
  s.sparsity = Sparsity::block_sparse;
  s.block_size = block;
  return s;
}

// The five tiling fields the grid spans, as text (other knobs, such as a kernel path, left out).
std::string tiling(const AttentionConfig& c) {
  return std::to_string(c.warps) + "," + std::to_string(c.m_tiles) + "," + std::to_string(c.block_n) + "," +
         std::to_string(c.stages) + "," + std::to_string(c.q_in_registers);
}

tune::DeviceModel test_device() { return {"NVIDIA H100 80GB HBM3", 9, 0, 132}; }

// A database in a fresh folder named by SJIT_TUNE_DIR, the hook keyed by test_device() and the policy
// `policy`, all put back at the end.
class HookFixture {
 public:
  explicit HookFixture(AutotunePolicy policy = AutotunePolicy::on) : folder_("sjit-attention-tune-test-") {
    if (const char* dir = std::getenv("SJIT_TUNE_DIR")) saved_dir_ = dir;
    ::setenv("SJIT_TUNE_DIR", folder_.path().c_str(), 1);
    tuning::set_attention_device_for_tests(test_device());
    set_autotune_policy(policy);
  }
  ~HookFixture() {
    set_autotune_policy(AutotunePolicy::off);
    tuning::set_attention_device_for_tests(std::nullopt);
    if (saved_dir_) ::setenv("SJIT_TUNE_DIR", saved_dir_->c_str(), 1);
    else ::unsetenv("SJIT_TUNE_DIR");
  }
  HookFixture(const HookFixture&) = delete;
  HookFixture& operator=(const HookFixture&) = delete;

  const std::filesystem::path& folder() const { return folder_.path(); }

  // Stores `winner` for (test_device(), spec, bucket) as a tuning would, measured with `kernels` (by
  // default this build's).
  void store(const AttentionSpec& spec, const std::string& bucket, const std::string& winner,
             const std::string& kernels = tuning::current_kernels()) const {
    store_entry("attention", key(canonical(spec)), bucket, winner, key(resolve(spec, {})), kernels);
  }
  // The same for any op's entry (the backward's "attention_dq" and "attention_walk").
  void store_entry(const std::string& op, const std::string& spec_key, const std::string& bucket,
                   const std::string& winner, const std::string& default_config,
                   const std::string& kernels = tuning::current_kernels()) const {
    tune::TuningEntry e;
    e.key = {test_device(), op, spec_key, bucket};
    e.winner_config = winner;
    e.winner_us = 100;
    e.default_config = default_config;
    e.default_us = 120;
    e.candidates = 40;
    e.measured_at = "2025-01-02T03:04:05Z";
    e.library_version = "test";
    e.kernels = kernels;
    REQUIRE(tune::TuningDb(folder()).store(e));
  }

 private:
  test::TempDir folder_;
  std::optional<std::string> saved_dir_;
};

// A tiling other than the spec's default, which the spec accepts.
constexpr const char* kStoredWinner = "warps=8,mt=1,bn=64,stages=3,qreg=1";

std::string resolved_key(const AttentionSpec& spec, const std::string& config_text) {
  return key(resolve(spec, parse_attention_config(config_text)));
}

}  // namespace

TEST_CASE("attention results are bucketed by key length rounded up to a power of two", "[tune][attention]") {
  CHECK(tuning::attention_bucket(1) == "sk<=1");
  CHECK(tuning::attention_bucket(3) == "sk<=4");
  CHECK(tuning::attention_bucket(4096) == "sk<=4096");
  CHECK(tuning::attention_bucket(4097) == "sk<=8192");
  CHECK(tuning::attention_bucket(8192) == "sk<=8192");
  CHECK(tuning::attention_bucket(2147483647) == "sk<=2147483648");
  CHECK_THROWS_AS(tuning::attention_bucket(0), InvalidArgument);
  CHECK_THROWS_WITH(tuning::attention_bucket(-5), Contains("seq_k = -5"));
}

TEST_CASE("the bucket that serves a problem is its own, else the nearest power of two, ties to the longer",
          "[tune][attention]") {
  const std::vector<std::string> stored = {"sk<=1024", "sk<=8192", "rows<=65536", "sk<=3", "sk<=", "sk<=64x"};
  SECTION("its own bucket") {
    CHECK(tuning::best_attention_bucket(stored, 8000) == "sk<=8192");
    CHECK(tuning::best_attention_bucket(stored, 1024) == "sk<=1024");
    CHECK(tuning::best_attention_bucket(stored, 513) == "sk<=1024");
  }
  SECTION("the nearest by powers of two") {
    CHECK(tuning::best_attention_bucket(stored, 2048) == "sk<=1024");   // 2^11: 2^10 is one away, 2^13 two
    CHECK(tuning::best_attention_bucket(stored, 4096) == "sk<=8192");   // 2^12: 2^13 is one away
    CHECK(tuning::best_attention_bucket(stored, 65536) == "sk<=8192");
    CHECK(tuning::best_attention_bucket(stored, 16) == "sk<=1024");
  }
  SECTION("a tie goes to the longer keys") {
    CHECK(tuning::best_attention_bucket({"sk<=1024", "sk<=4096"}, 2048) == "sk<=4096");
    CHECK(tuning::best_attention_bucket({"sk<=4096", "sk<=1024"}, 2048) == "sk<=4096");
  }
  SECTION("no shape known: the longest keys") {
    CHECK(tuning::best_attention_bucket(stored) == "sk<=8192");
    CHECK(tuning::best_attention_bucket({"sk<=16", "sk<=2147483648", "sk<=65536"}) == "sk<=2147483648");
  }
  SECTION("texts that are not attention buckets serve nothing") {
    CHECK_FALSE(tuning::best_attention_bucket({}, 4096).has_value());
    CHECK_FALSE(tuning::best_attention_bucket({"rows<=4096", "sk<=3", "sk<=-4", "sk<=4096 "}, 4096).has_value());
  }
}

TEST_CASE("the candidate grid: the default first, every mix of the knobs once, refusals with resolve's reason",
          "[tune][attention]") {
  AttentionSpec baked = bsr_spec(64, 32);
  baked.sparsity = Sparsity::baked;
  baked.pattern_digest = 0x1234;
  for (const AttentionSpec& spec : {dense_spec(128), dense_spec(64), dense_spec(256), bsr_spec(128, 128),
                                    bsr_spec(64, 16), baked}) {
    CAPTURE(key(spec));
    const std::vector<AttentionTuneCandidate> candidates = attention_candidates(spec);
    REQUIRE_FALSE(candidates.empty());
    CHECK(key(candidates.front().config) == key(resolve(spec, {})));
    CHECK(candidates.front().rejected.empty());

    std::set<std::string> keys;
    std::multiset<std::string> tilings;
    for (const AttentionTuneCandidate& c : candidates) {
      CAPTURE(key(c.config));
      CHECK(keys.insert(key(c.config)).second);  // no config twice
      tilings.insert(tiling(c.config));
      CHECK(c.median_us == 0);
      if (c.rejected.empty()) {
        CHECK(key(resolve(spec, c.config)) == key(c.config));  // accepted, and already resolved
      } else {
        CHECK_THROWS_AS(resolve(spec, c.config), InvalidArgument);
        CHECK_THROWS_WITH(resolve(spec, c.config), c.rejected);
      }
    }
    // Every mix of the grid the issue names is there, accepted or refused.
    for (int warps : {4, 8})
      for (int m_tiles : {1, 2})
        for (int block_n : {32, 64, 128})
          for (int stages : {2, 3})
            for (int qreg : {0, 1}) {
              AttentionConfig c;
              c.warps = warps, c.m_tiles = m_tiles, c.block_n = block_n, c.stages = stages, c.q_in_registers = qreg;
              CAPTURE(tiling(c));
              CHECK(tilings.count(tiling(c)) >= 1);
            }
  }
}

TEST_CASE("tilings that do not fit are refused by the grid, with the reason", "[tune][attention]") {
  auto find = [](const std::vector<AttentionTuneCandidate>& all, const std::string& text) {
    for (const AttentionTuneCandidate& c : all)
      if (tiling(c.config) == text) return c;
    FAIL("no candidate " << text);
    return AttentionTuneCandidate{};
  };
  // d = 256, a 256-row Q tile (128 KB) and three 128-key K/V stages (384 KB): far over 227 KB.
  CHECK_THAT(find(attention_candidates(dense_spec(256)), "8,2,128,3,0").rejected, Contains("shared memory"));
  // Pattern blocks of 16 under a 256 x 128 tile: 16 x 8 = 128 blocks, the tile mask holds 64.
  CHECK_THAT(find(attention_candidates(bsr_spec(64, 16)), "8,2,128,2,1").rejected, Contains("pattern blocks"));
  // A small tile at d = 64 fits every way.
  CHECK(find(attention_candidates(dense_spec(64)), "4,1,32,2,1").rejected.empty());
}

TEST_CASE("the grid holds both kernel paths, and the default is the device's", "[tune][attention]") {
  auto on_path = [](const std::vector<AttentionTuneCandidate>& all, AttentionPath path, bool accepted) {
    return std::count_if(all.begin(), all.end(), [&](const AttentionTuneCandidate& c) {
      return c.config.path == path && c.rejected.empty() == accepted;
    });
  };
  const std::vector<AttentionTuneCandidate> d128 = attention_candidates(dense_spec(128));
  CHECK(on_path(d128, AttentionPath::mma, true) > 0);
  CHECK(on_path(d128, AttentionPath::wgmma, true) > 0);
  // wgmma takes 64-row warpgroups (mt = 1), 16 to 128 keys and Q in shared memory: the rest is refused.
  for (const AttentionTuneCandidate& c : d128)
    if (c.config.path == AttentionPath::wgmma && (c.config.m_tiles != 1 || c.config.q_in_registers != 0)) {
      CAPTURE(key(c.config));
      CHECK_THAT(c.rejected, Contains("wgmma"));
    }
  // At d = 256 the one-item kernel takes 32- and 64-key tiles (128-key ones do not fit) and the
  // persistent kernel nothing; d = 96 takes both kernels (in whole swizzle blocks, as d = 128) and d = 32
  // neither.
  const std::vector<AttentionTuneCandidate> d256 = attention_candidates(dense_spec(256));
  CHECK(on_path(d256, AttentionPath::wgmma, true) > 0);
  CHECK(on_path(d256, AttentionPath::wgmma_ws, true) == 0);
  for (const AttentionTuneCandidate& c : d256)
    if (c.config.path == AttentionPath::wgmma && c.rejected.empty()) CHECK(c.config.block_n <= 64);
  CHECK(on_path(attention_candidates(dense_spec(96)), AttentionPath::wgmma, true) > 0);
  CHECK(on_path(attention_candidates(dense_spec(96)), AttentionPath::wgmma_ws, true) > 0);
  CHECK(on_path(attention_candidates(dense_spec(32)), AttentionPath::wgmma, true) == 0);
  // On compute capability 9.0 the default is resolve's for that device, and it comes first.
  for (const AttentionSpec& spec : {dense_spec(128), dense_spec(64), dense_spec(256), bsr_spec(128, 128), bsr_spec(64, 16)}) {
    CAPTURE(key(spec));
    CHECK(key(attention_candidates(spec, 90).front().config) == key(resolve(spec, {}, 90)));
    CHECK(attention_candidates(spec, 90).size() == attention_candidates(spec).size());
  }
}

TEST_CASE("an Attention with an all-unset config takes the stored winner when the policy is on or force",
          "[tune][attention]") {
  const AttentionSpec spec = dense_spec(128);
  REQUIRE(resolved_key(spec, kStoredWinner) != key(resolve(spec, {})));  // else the test proves nothing
  for (AutotunePolicy policy : {AutotunePolicy::on, AutotunePolicy::force}) {
    CAPTURE(int(policy));
    HookFixture fixture(policy);
    fixture.store(spec, "sk<=8192", kStoredWinner);
    CHECK(key(Attention(spec).config()) == resolved_key(spec, kStoredWinner));
    CHECK(key(Attention(spec).config()) == resolved_key(spec, kStoredWinner));  // the remembered lookup
  }
}

TEST_CASE("an explicit config always wins over a stored winner", "[tune][attention]") {
  HookFixture fixture;
  const AttentionSpec spec = dense_spec(128);
  fixture.store(spec, "sk<=8192", kStoredWinner);
  AttentionConfig explicit_config;
  explicit_config.warps = 4;  // even one field set makes the config explicit
  CHECK(key(Attention(spec, explicit_config).config()) == key(resolve(spec, explicit_config)));
  CHECK(key(Attention(spec, explicit_config).config()) != resolved_key(spec, kStoredWinner));
}

TEST_CASE("with the policy off the stored winner is not used", "[tune][attention]") {
  HookFixture fixture(AutotunePolicy::off);
  const AttentionSpec spec = dense_spec(128);
  fixture.store(spec, "sk<=8192", kStoredWinner);
  CHECK(key(Attention(spec).config()) == key(resolve(spec, {})));
}

TEST_CASE("without a shape the hook takes the longest stored bucket", "[tune][attention]") {
  HookFixture fixture;
  const AttentionSpec spec = dense_spec(64);
  fixture.store(spec, "sk<=1024", "warps=4,mt=1,bn=32,stages=2,qreg=1");
  fixture.store(spec, "sk<=16384", kStoredWinner);
  fixture.store(spec, "sk<=4096", "warps=4,mt=2,bn=128,stages=2,qreg=0");
  CHECK(key(Attention(spec).config()) == resolved_key(spec, kStoredWinner));
  // Another spec has no entry: its heuristic default.
  CHECK(key(Attention(dense_spec(128)).config()) == key(resolve(dense_spec(128), {})));
}

TEST_CASE("the baked constructor looks up the spec with the pattern's digest", "[tune][attention]") {
  HookFixture fixture;
  const BlockPattern pattern = patterns::random(64, 512, 512, 0.25, 3);
  AttentionSpec spec = bsr_spec(128, 64);
  AttentionSpec baked = spec;
  baked.sparsity = Sparsity::baked;
  baked.pattern_digest = pattern.digest();
  const std::string winner = "warps=4,mt=2,bn=64,stages=3,qreg=0";
  REQUIRE(resolved_key(baked, winner) != key(resolve(baked, {})));
  fixture.store(baked, "sk<=512", winner);
  CHECK(key(Attention(spec, pattern).config()) == resolved_key(baked, winner));
  // The runtime-pattern spec has no entry of its own.
  CHECK(key(Attention(spec).config()) == key(resolve(spec, {})));
}

TEST_CASE("a corrupt entry or a winner the library refuses is ignored, with one warning", "[tune][attention]") {
  HookFixture fixture;
  const AttentionSpec spec = dense_spec(128);
  SECTION("a corrupt file") {
    fixture.store(spec, "sk<=8192", kStoredWinner);
    const std::vector<std::filesystem::path> files = test::files_under(fixture.folder());
    REQUIRE(files.size() == 1);
    test::write_file(files.front(), "{\"key\": tor");
    test::CapturedStderr captured;
    CHECK(key(Attention(spec).config()) == key(resolve(spec, {})));
    CHECK_THAT(captured.text(), Contains(files.front().string()));
  }
  SECTION("a winner that does not parse, or that resolve() refuses: the next best bucket serves") {
    const std::string bad = GENERATE(as<std::string>{}, "warps=5,mt=1,bn=64,stages=2,qreg=0", "warps=4,colour=red");
    CAPTURE(bad);
    fixture.store(spec, "sk<=65536", bad);
    fixture.store(spec, "sk<=2048", kStoredWinner);
    test::CapturedStderr captured;
    CHECK(key(Attention(spec).config()) == resolved_key(spec, kStoredWinner));
    CHECK_THAT(captured.text(), Contains(bad) && Contains("tune again"));
  }
}

// A tuning measured with other kernels (another sparsejit's, or written before entries recorded them)
// may name a winner that is no longer the fastest: launches pass over it, say so once, and `sjit tune
// --show` lists it as such (tuning_entries).
TEST_CASE("a tiling tuned with other kernels is passed over, with one warning, and listed as such", "[tune][attention]") {
  HookFixture fixture;
  const AttentionSpec spec = dense_spec(128);
  REQUIRE(resolved_key(spec, kStoredWinner) != key(resolve(spec, {})));
  const std::string other = GENERATE(as<std::string>{}, "", "00000000deadbeef");
  CAPTURE(other);
  REQUIRE(other != tuning::current_kernels());
  fixture.store(spec, "sk<=8192", kStoredWinner, other);
  {
    test::CapturedStderr captured;
    CHECK(key(Attention(spec).config()) == key(resolve(spec, {})));
    CHECK_THAT(captured.text(), Contains("other kernels") && Contains("sjit tune") && Contains(tuning::current_kernels()));
  }
  const std::vector<TunedEntry> listed = tuning_entries();
  REQUIRE(listed.size() == 1);
  CHECK_FALSE(listed.front().current_kernels);
  // Tuned again with these kernels: used.
  fixture.store(spec, "sk<=8192", kStoredWinner);
  tuning::set_attention_device_for_tests(test_device());  // forget what was looked up
  CHECK(key(Attention(spec).config()) == resolved_key(spec, kStoredWinner));
  CHECK(tuning_entries().front().current_kernels);
}

// A tuning's times depend on the templates and on the sources that generate kernels from them and
// choose among them (a default tiling, a rule): an entry names both, so a change to either passes it over.
TEST_CASE("a tuning entry's kernels name the templates and the sources that choose kernels", "[tune][attention]") {
  const std::string kernels = tuning::current_kernels();
  const std::string choices(codegen::kernel_choices_fingerprint());
  auto hex16 = [](const std::string& s) {
    return s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
  };
  CHECK(hex16(kernels));
  CHECK(hex16(choices));
  // Not the templates' hash alone: a build whose templates match but whose choices differ is other kernels.
  CHECK(kernels != fmt::format("{:016x}", codegen::templates_hash()));
  CHECK(kernels == tuning::current_kernels());  // stable within a process
}

TEST_CASE("a candidate's output matches the default's within rounding, and a wrong or unwritten one does not",
          "[tune][attention]") {
  // 3 million elements: several chunks of the parallel comparison; rows of 128 as attention's O.
  const std::size_t row = 128, n = 3 * (std::size_t(1) << 20) + 5 * row;
  std::mt19937_64 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> want(n);
  for (float& x : want) x = dist(rng);
  std::vector<float> got = want;
  for (std::size_t i = 0; i < n; i += 7) got[i] *= 1.0f + 0.004f;  // half a bf16 unit: rounding
  CHECK(tuning::compare_rows(DType::bf16, row, got, want).empty());

  SECTION("one element off by 10% of its row's largest value, late in the array") {
    const std::size_t at = n - 3 * row + 17;
    double row_max = 0;
    for (std::size_t k = at - 17; k < at - 17 + row; ++k) row_max = std::max(row_max, double(std::abs(want[k])));
    got[at] = want[at] + float(0.1 * row_max);
    CHECK_THAT(tuning::compare_rows(DType::bf16, row, got, want), Contains("element 17"));
  }
  SECTION("an element left poisoned (NaN)") {
    got[12345] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(tuning::compare_rows(DType::bf16, row, got, want), Contains("row 96 element 57"));
  }
  SECTION("the first difference is the one reported") {
    got[n - 1] = want[n - 1] + 100;
    got[300] = want[300] + 100;
    CHECK_THAT(tuning::compare_rows(DType::bf16, row, got, want), Contains("row 2 element 44"));
  }
  SECTION("equal infinities match (an empty row's -inf log-sum-exp)") {
    want[5] = got[5] = -std::numeric_limits<float>::infinity();
    CHECK(tuning::compare_rows(DType::bf16, row, got, want).empty());
  }
}

// How the backward sums dQ, as tune_dq_summation stores it (docs/tuning.md, "Attention backward").
TEST_CASE("dQ results are bucketed by GQA group and key tiles a query row rounded up to a power of two",
          "[tune][attention][backward]") {
  CHECK(tuning::dq_bucket(1, 6.0) == "group=1,tiles<=8");
  CHECK(tuning::dq_bucket(1, 2.0) == "group=1,tiles<=2");
  CHECK(tuning::dq_bucket(1, 2.01) == "group=1,tiles<=4");
  CHECK(tuning::dq_bucket(4, 0.5) == "group=4,tiles<=1");
  CHECK(tuning::dq_bucket(8, 0) == "group=8,tiles<=1");
  CHECK(tuning::dq_bucket(2, 64) == "group=2,tiles<=64");
  CHECK(tuning::dq_bucket(1, 6.0, {.gathered = true}) == "group=1,tiles<=8,walk=gathered");  // other kernels: apart
  CHECK(tuning::dq_bucket(4, 0.5, {.gathered = true}) == "group=4,tiles<=1,walk=gathered");
  // An accumulator beyond the L2 (long sequences) changes which way wins: apart too.
  CHECK(tuning::dq_bucket(1, 10, {.beyond_l2 = true}) == "group=1,tiles<=16,beyond_l2");
  CHECK(tuning::dq_bucket(4, 0.5, {.gathered = true, .beyond_l2 = true}) == "group=4,tiles<=1,walk=gathered,beyond_l2");
  // d = 64's 64-query dK/dV tiles (short walks of small blocks): other kernels, apart.
  CHECK(tuning::dq_bucket(1, 3, {.narrow_queries = true}) == "group=1,tiles<=4,walk=narrow");
  CHECK(tuning::dq_bucket(2, 3, {.beyond_l2 = true, .narrow_queries = true}) == "group=2,tiles<=4,walk=narrow,beyond_l2");
  CHECK_THROWS_WITH(tuning::dq_bucket(1, 3, {.gathered = true, .narrow_queries = true}), Contains("not both"));
  CHECK_THROWS_WITH(tuning::dq_bucket(0, 6), Contains("group = 0"));
  CHECK_THROWS_WITH(tuning::dq_bucket(1, -1), Contains("key_tiles_per_row = -1"));
  CHECK_THROWS_AS(tuning::dq_bucket(1, std::numeric_limits<double>::quiet_NaN()), InvalidArgument);
}

TEST_CASE("a stored way of summing dQ is used for its own bucket only, and only with the policy on",
          "[tune][attention][backward]") {
  AttentionSpec spec = bsr_spec(128, 128);
  spec.pass = Pass::backward;
  spec = canonical(spec);
  auto store_way = [&](const HookFixture& hook, const std::string& bucket, const std::string& way,
                       const std::string& kernels = tuning::current_kernels()) {
    hook.store_entry("attention_dq", key(spec), bucket, way, "atomic", kernels);
  };
  SECTION("policy on") {
    const HookFixture hook(AutotunePolicy::on);
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 1, 6).has_value());  // nothing stored yet (remembered)
    tuning::set_attention_device_for_tests(test_device());            // forget what was looked up
    store_way(hook, "group=1,tiles<=8", "pass");
    store_way(hook, "group=4,tiles<=8", "atomic");
    store_way(hook, "group=1,tiles<=2", "fastest");  // not a way: reported, then the rule decides
    REQUIRE(tuning::tuned_dq_summation(spec, 1, 6).has_value());
    CHECK(*tuning::tuned_dq_summation(spec, 1, 6) == DqSummation::pass);
    CHECK(*tuning::tuned_dq_summation(spec, 1, 5) == DqSummation::pass);  // the same bucket
    CHECK(*tuning::tuned_dq_summation(spec, 4, 7.5) == DqSummation::atomic);
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 1, 9).has_value());  // tiles<=16: not stored, no neighbour
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 2, 6).has_value());
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 1, 2).has_value());
    // The gathered backward's ways are stored apart: neither serves the other's problems.
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 1, 6, {.gathered = true}).has_value());
    tuning::set_attention_device_for_tests(test_device());  // forget what was looked up
    store_way(hook, "group=1,tiles<=8,walk=gathered", "atomic");
    REQUIRE(tuning::tuned_dq_summation(spec, 1, 6, {.gathered = true}).has_value());
    CHECK(*tuning::tuned_dq_summation(spec, 1, 6, {.gathered = true}) == DqSummation::atomic);
    CHECK(*tuning::tuned_dq_summation(spec, 1, 6) == DqSummation::pass);
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 4, 7.5, {.gathered = true}).has_value());
    AttentionSpec other = spec;
    other.head_dim = 64;
    CHECK_FALSE(tuning::tuned_dq_summation(canonical(other), 1, 6).has_value());
  }
  SECTION("policy off") {
    const HookFixture hook(AutotunePolicy::off);
    store_way(hook, "group=1,tiles<=8", "pass");
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 1, 6).has_value());
  }
  SECTION("measured with other kernels: passed over") {
    const HookFixture hook(AutotunePolicy::on);
    store_way(hook, "group=1,tiles<=8", "pass", "00000000deadbeef");
    test::CapturedStderr captured;
    CHECK_FALSE(tuning::tuned_dq_summation(spec, 1, 6).has_value());
    CHECK_THAT(captured.text(), Contains("attention_dq") && Contains("other kernels"));
  }
}

// How the backward walks one pattern, as tune_backward_walk stores it (docs/tuning.md).
TEST_CASE("a backward walk is stored as its three choices, for one pattern and group",
          "[tune][attention][backward]") {
  using tuning::TunedWalk;
  for (const BackwardWalk walk : {BackwardWalk::tiles, BackwardWalk::packed, BackwardWalk::gathered})
    for (const DqSummation dq : {DqSummation::atomic, DqSummation::pass}) {
      const TunedWalk choice{walk, walk == BackwardWalk::gathered ? 0 : 128, dq};
      const std::string text = tuning::walk_choice_text(choice);
      CAPTURE(text);
      REQUIRE(tuning::parse_walk_choice(text).has_value());
      CHECK(*tuning::parse_walk_choice(text) == choice);
    }
  CHECK(tuning::walk_choice_text({BackwardWalk::packed, 64, DqSummation::pass}) == "walk=packed,query_tiles=64,dq=pass");
  // Texts it never writes: the gathered walk with query tiles, another walk without, fields missing,
  // out of order or unknown.
  for (const char* text : {"walk=gathered,query_tiles=64,dq=atomic", "walk=tiles,query_tiles=0,dq=atomic",
                           "walk=tiles,query_tiles=96,dq=atomic", "walk=packed,dq=atomic",
                           "dq=atomic,walk=packed,query_tiles=64", "walk=sideways,query_tiles=64,dq=atomic",
                           "walk=packed,query_tiles=64,dq=atomic,", "", "atomic"}) {
    CAPTURE(text);
    CHECK_FALSE(tuning::parse_walk_choice(text).has_value());
  }
  CHECK(tuning::walk_bucket(0xc0ffee, 4) == "pattern=0000000000c0ffee,group=4");
  CHECK_THROWS_WITH(tuning::walk_bucket(1, 0), Contains("group = 0"));
}

TEST_CASE("a stored backward walk is used for its own pattern and group only, and only with the policy on",
          "[tune][attention][backward]") {
  AttentionSpec spec = bsr_spec(64, 32);
  spec.pass = Pass::backward;
  spec = canonical(spec);
  const tuning::TunedWalk packed{BackwardWalk::packed, 64, DqSummation::pass};
  auto store_walk = [&](const HookFixture& hook, const std::string& bucket, const std::string& choice,
                        const std::string& kernels = tuning::current_kernels()) {
    hook.store_entry("attention_walk", key(spec), bucket, choice, "walk=gathered,query_tiles=0,dq=atomic", kernels);
  };
  SECTION("policy on") {
    const HookFixture hook(AutotunePolicy::on);
    CHECK_FALSE(tuning::tuned_backward_walk(spec, 0xabc, 1).has_value());  // nothing stored yet (remembered)
    tuning::set_attention_device_for_tests(test_device());                // forget what was looked up
    store_walk(hook, tuning::walk_bucket(0xabc, 1), tuning::walk_choice_text(packed));
    store_walk(hook, tuning::walk_bucket(0xabd, 1), "fastest");  // not a choice: reported, then the rules decide
    REQUIRE(tuning::tuned_backward_walk(spec, 0xabc, 1).has_value());
    CHECK(*tuning::tuned_backward_walk(spec, 0xabc, 1) == packed);
    CHECK_FALSE(tuning::tuned_backward_walk(spec, 0xabc, 2).has_value());  // another group
    CHECK_FALSE(tuning::tuned_backward_walk(spec, 0xabe, 1).has_value());  // another pattern
    test::CapturedStderr captured;
    CHECK_FALSE(tuning::tuned_backward_walk(spec, 0xabd, 1).has_value());
    CHECK_THAT(captured.text(), Contains("'fastest'") && Contains("tune again"));
    AttentionSpec other = spec;
    other.head_dim = 128;
    CHECK_FALSE(tuning::tuned_backward_walk(canonical(other), 0xabc, 1).has_value());
  }
  SECTION("policy off") {
    const HookFixture hook(AutotunePolicy::off);
    store_walk(hook, tuning::walk_bucket(0xabc, 1), tuning::walk_choice_text(packed));
    CHECK_FALSE(tuning::tuned_backward_walk(spec, 0xabc, 1).has_value());
  }
  SECTION("measured with other kernels: passed over") {
    const HookFixture hook(AutotunePolicy::on);
    store_walk(hook, tuning::walk_bucket(0xabc, 1), tuning::walk_choice_text(packed), "00000000deadbeef");
    test::CapturedStderr captured;
    CHECK_FALSE(tuning::tuned_backward_walk(spec, 0xabc, 1).has_value());
    CHECK_THAT(captured.text(), Contains("attention_walk") && Contains("other kernels"));
  }
}

// The forward's tiling picked for one pattern, as tune_attention stores it where a pick wins.
TEST_CASE("a stored forward pick is used for its own pattern and heads only, and only with the policy on",
          "[tune][attention]") {
  for (const char* pick : {"narrow", "wide", "gathered_heads=1", "gathered_heads=2", "gathered_heads=4"})
    CHECK(tuning::is_forward_pick(pick));
  for (const char* text : {"gathered_heads=3", "gathered", "Wide", "", "warps=4,mt=1,bn=16,stages=2,qreg=0"})
    CHECK_FALSE(tuning::is_forward_pick(text));
  CHECK(tuning::forward_pick_bucket(0xc0ffee, 2) == "pattern=0000000000c0ffee,heads=2");
  CHECK_THROWS_WITH(tuning::forward_pick_bucket(1, 3), Contains("heads = 3 must be 1, 2 or 4"));

  const AttentionSpec spec = canonical(bsr_spec(128, 16));
  auto store_pick = [&](const HookFixture& hook, std::uint64_t digest, int heads, const std::string& pick,
                        const std::string& kernels = tuning::current_kernels()) {
    hook.store_entry("attention_pattern", key(spec), tuning::forward_pick_bucket(digest, heads), pick, "narrow",
                     kernels);
  };
  SECTION("policy on") {
    const HookFixture hook(AutotunePolicy::on);
    store_pick(hook, 0xabc, 2, "gathered_heads=2");
    store_pick(hook, 0xabd, 1, "sideways");  // not a pick: reported, then the rules decide
    REQUIRE(tuning::tuned_forward_pick(spec, 0xabc, 2).has_value());
    CHECK(*tuning::tuned_forward_pick(spec, 0xabc, 2) == "gathered_heads=2");
    CHECK_FALSE(tuning::tuned_forward_pick(spec, 0xabc, 1).has_value());  // other heads
    CHECK_FALSE(tuning::tuned_forward_pick(spec, 0xabe, 2).has_value());  // another pattern
    test::CapturedStderr captured;
    CHECK_FALSE(tuning::tuned_forward_pick(spec, 0xabd, 1).has_value());
    CHECK_THAT(captured.text(), Contains("'sideways'") && Contains("tune again"));
    CHECK_FALSE(tuning::tuned_forward_pick(canonical(bsr_spec(64, 16)), 0xabc, 2).has_value());
  }
  SECTION("policy off") {
    const HookFixture hook(AutotunePolicy::off);
    store_pick(hook, 0xabc, 2, "wide");
    CHECK_FALSE(tuning::tuned_forward_pick(spec, 0xabc, 2).has_value());
  }
  SECTION("measured with other kernels: passed over") {
    const HookFixture hook(AutotunePolicy::on);
    store_pick(hook, 0xabc, 2, "wide", "00000000deadbeef");
    test::CapturedStderr captured;
    CHECK_FALSE(tuning::tuned_forward_pick(spec, 0xabc, 2).has_value());
    CHECK_THAT(captured.text(), Contains("attention_pattern") && Contains("other kernels"));
  }
}

// Checked before any GPU work.
TEST_CASE("tune_backward_walk refuses a shape without a pattern and a dense spec", "[tune][attention][backward]") {
  AttentionSpec spec;
  spec.head_dim = 64;
  spec.sparsity = Sparsity::block_sparse;
  spec.block_size = 32;
  AttentionTuneShape shape;
  shape.heads_q = 2, shape.heads_kv = 2, shape.seq_q = 256, shape.seq_k = 256;
  CHECK_THROWS_WITH(tune_backward_walk(spec, shape), Contains("shape.pattern is null") && Contains("--pattern FILE"));
  const BlockPattern pattern = patterns::random(32, 256, 256, 0.25, 3);
  shape.pattern = &pattern;
  spec.sparsity = Sparsity::dense;
  spec.block_size = 0;
  CHECK_THROWS_AS(tune_backward_walk(spec, shape), InvalidArgument);
}

// The CLI checks its flags before anything else (no GPU needed to be refused).
TEST_CASE("sjit tune --walk needs --backward and --pattern, and op attention", "[tune][attention][tool]") {
  const std::string spec = "attention:d=64,dtype=bf16,causal=none,sparsity=bsr,block=32,pass=fwd";
  int status = 0;
  std::string out = test::run_tool(fmt::format("tune attention {} --shape 1,2,2,256,256 --walk", spec), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("--walk tunes how the backward walks a pattern: add --backward"));
  out = test::run_tool(fmt::format("tune attention {} --shape 1,2,2,256,256 --walk --backward", spec), &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("give it with --pattern FILE"));
  out = test::run_tool("tune rownorm rownorm:kind=softmax,n=64 --walk", &status);
  CHECK(status != 0);
  CHECK_THAT(out, Contains("use them with op attention"));
}
