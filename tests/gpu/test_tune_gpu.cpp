// The autotuner on the GPU: it never picks a slower or a wrong layout, and launches use what it stored.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "sparsejit/attention_reference.h"
#include "sparsejit/sparsejit.h"
#include "support/attention_support.h"
#include "support/test_support.h"
#include "tune/attention_tuned_configs.h"

using namespace sjit;
using Catch::Matchers::Contains;

namespace {

double median_us(RowNorm& op, DeviceBuffer& x, DeviceBuffer& y, std::int64_t rows) {
  EventTimer timer;
  for (int i = 0; i < 10; ++i) op.forward({x.data(), y.data(), rows});
  std::vector<double> us;
  for (int i = 0; i < 51; ++i) {
    timer.start();
    op.forward({x.data(), y.data(), rows});
    us.push_back(timer.stop_ms() * 1000);
  }
  std::nth_element(us.begin(), us.begin() + 25, us.end());
  return us[25];
}

// The autotune policy for a scope, off again however the scope ends.
struct PolicyScope {
  explicit PolicyScope(AutotunePolicy policy) { set_autotune_policy(policy); }
  ~PolicyScope() { set_autotune_policy(AutotunePolicy::off); }
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;
};

}  // namespace

TEST_CASE("the tuner refuses a layout whose output is wrong and keeps one no slower than the default", "[gpu][tune]") {
  const RowNormSpec spec = entmax_spec(1.5f, 64);
  RowNormConfig wrong = resolve(spec, {});
  wrong.wrong_result_for_tests = true;
  TuneOptions options;
  options.rows = 1 << 16;
  options.extra_candidates = {wrong};
  options.store = false;
  const TuneReport report = tune_rownorm(spec, options);

  REQUIRE(report.candidates.size() > 2);
  const auto sabotaged = std::find_if(report.candidates.begin(), report.candidates.end(),
                                      [](const TuneCandidate& c) { return c.config.wrong_result_for_tests; });
  REQUIRE(sabotaged != report.candidates.end());
  CHECK_THAT(sabotaged->rejected, Contains("wrong output"));
  CHECK_FALSE(report.winner.wrong_result_for_tests);
  CHECK(report.winner_us <= report.default_us);

  // Timed again, independently: the winner is no slower than the default (15% for noise).
  const std::int64_t rows = options.rows;
  std::mt19937_64 rng(test::fresh_seed());
  const auto host = test::random_rows(rng, rows, spec.n, 1.0f);
  DeviceBuffer x(host.size() * 4), y(host.size() * 4);
  x.upload(host.data(), host.size() * 4);
  RowNorm tuned(spec, report.winner), fallback(spec, report.default_config);
  const double tuned_us = median_us(tuned, x, y, rows), default_us = median_us(fallback, x, y, rows);
  INFO("winner " << key(report.winner) << " " << tuned_us << " us, default " << default_us << " us");
  CHECK(tuned_us <= default_us * 1.15);
}

TEST_CASE("with SJIT_AUTOTUNE=on a launch tunes once and later launches use the stored layout", "[gpu][tune]") {
  set_autotune_policy(AutotunePolicy::on);
  const RowNormSpec spec = sparsemax_spec(48);
  const std::int64_t rows = 5000;
  DeviceBuffer x(rows * 48 * 4), y(rows * 48 * 4);
  x.fill_bytes(0);
  const std::size_t before = tuning_entries().size();
  RowNorm(spec).forward({x.data(), y.data(), rows});
  synchronize();
  const auto entries = tuning_entries();
  CHECK(entries.size() == before + 1);
  const std::string stored = std::find_if(entries.begin(), entries.end(), [&](const TunedEntry& e) {
                               return e.spec_key == key(spec);
                             })->winner_config;
  // A new RowNorm, same bucket (rows 4097..8192): the stored layout, no new tuning.
  RowNorm again(spec);
  CHECK(key(again.config_for({x.data(), y.data(), 6000})) == stored);
  CHECK(tuning_entries().size() == before + 1);
  set_autotune_policy(AutotunePolicy::off);
}

TEST_CASE("tuning an attention stores a winner no slower than the default, and a later Attention runs it correctly",
          "[gpu][tune][attention]") {
  AttentionSpec spec;
  spec.head_dim = 64;
  spec.causal = Causal::top_left;
  AttentionTuneShape shape;
  shape.batch = 1, shape.heads_q = 8, shape.heads_kv = 2, shape.seq_q = 1024, shape.seq_k = 1024;
  TuneOptions options;
  options.warmup = 2;
  options.iterations = 10;
  const AttentionTuneReport report = tune_attention(spec, shape, options);

  CHECK(report.bucket == "sk<=1024");
  CHECK(key(report.candidates.front().config) == key(report.default_config));
  int timed = 0;
  for (const AttentionTuneCandidate& c : report.candidates) {
    CAPTURE(key(c.config), c.rejected);
    if (!c.rejected.empty()) continue;
    ++timed;
    CHECK(c.median_us > 0);
    CHECK(c.median_us >= report.winner_us);  // the winner is the fastest timed
  }
  CHECK(timed >= 2);
  CHECK(report.winner_us <= report.default_us);
  REQUIRE(report.stored);
  const auto entries = tuning_entries();
  const auto stored = std::find_if(entries.begin(), entries.end(), [&](const TunedEntry& e) {
    return e.op == "attention" && e.spec_key == key(spec) && e.bucket == "sk<=1024";
  });
  REQUIRE(stored != entries.end());
  CHECK(stored->winner_config == key(report.winner));
  CHECK(stored->default_config == key(report.default_config));
  REQUIRE(tuned_attention_config(spec, 1000).has_value());
  CHECK(key(*tuned_attention_config(spec, 1000)) == key(report.winner));

  // Built afterwards with an all-unset config, policy on: the winner, and still the right answer.
  set_autotune_policy(AutotunePolicy::on);
  Attention attention(spec);
  set_autotune_policy(AutotunePolicy::off);
  INFO("winner " << key(report.winner) << ", default " << key(report.default_config));
  CHECK(key(attention.config()) == key(report.winner));

  const std::uint64_t seed = test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 rng(seed);
  const std::int64_t b = 2, hq = 4, hkv = 2, sq = 300, sk = 517, d = spec.head_dim;
  const auto q = test::quantized(spec.dtype, test::random_rows(rng, b * hq * sq, int(d), 1.0f));
  const auto k = test::quantized(spec.dtype, test::random_rows(rng, b * hkv * sk, int(d), 1.0f));
  const auto v = test::quantized(spec.dtype, test::random_rows(rng, b * hkv * sk, int(d), 1.0f));
  DeviceBuffer dq = test::upload(spec.dtype, q), dk = test::upload(spec.dtype, k), dv = test::upload(spec.dtype, v);
  DeviceBuffer out(std::size_t(b * hq * sq * d) * 2);
  out.fill_bytes(0xFF);  // NaN: an element the kernel forgets to write fails
  AttentionForwardArgs a;
  a.q = dq.data(), a.k = dk.data(), a.v = dv.data(), a.o = out.data();
  a.batch = b, a.heads_q = hq, a.heads_kv = hkv, a.seq_q = sq, a.seq_k = sk;
  attention.forward(a);
  synchronize();
  std::vector<unsigned char> bytes(out.bytes());
  out.download(bytes.data(), bytes.size());
  const std::vector<float> got = test::from_bytes(spec.dtype, bytes);
  const reference::AttentionOutput want = reference::attention_forward(
      test::reference_problem(spec, b, hq, hkv, sq, sk, nullptr), test::wide(q), test::wide(k), test::wide(v));
  // bf16 output: atol 2e-2, rtol 1e-2, as the attention suite.
  std::size_t bad = 0, first_bad = 0;
  for (std::size_t i = 0; i < want.o.size(); ++i)
    if (!(std::abs(double(got[i]) - want.o[i]) <= 2e-2 + 1e-2 * std::abs(want.o[i])) && bad++ == 0) first_bad = i;
  INFO("o[" << first_bad << "] = " << got[first_bad] << ", want " << want.o[first_bad]);
  CHECK(bad == 0);
}

// With pattern blocks of 16 on Hopper an untuned Attention picks its forward's tiling per pattern
// (Attention::forward_config: a sparse random pattern on the gathered-key kernel), and a stored tiling
// would take the place of that pick for every pattern. The tuner times the pick as the default and the
// other picks next, and where a pick wins stores it for that pattern only; a later Attention then
// takes the stored pick for that pattern where the policy is on, and its own for other patterns. To
// tell the stored pick from the rules', another pick is stored over the winner afterwards.
TEST_CASE("tuning the forward of small pattern blocks times the picks per pattern, and stores a winning pick for "
          "the pattern only",
          "[gpu][tune][attention]") {
  if (!test::on_hopper("the forward's tiling picked per pattern")) return;
  const AttentionSpec spec = test::spec_of(128, DType::bf16, Causal::none, Sparsity::block_sparse, 16);
  const std::int64_t s = 2048;
  const BlockPattern pattern = patterns::random(16, s, s, 0.1, 21), other = patterns::random(16, s, s, 0.5, 22);
  AttentionTuneShape shape;
  shape.batch = 1, shape.heads_q = 2, shape.heads_kv = 1, shape.seq_q = s, shape.seq_k = s;
  shape.pattern = &pattern;
  auto picked = [&](AutotunePolicy policy, const BlockPattern& p) {
    const PolicyScope scope(policy);
    return key(Attention(spec).forward_config(p, 2, 1));
  };
  const std::string untuned = picked(AutotunePolicy::off, pattern), spec_tiling = key(Attention(spec).config());
  INFO("picked for the pattern " << untuned << ", the spec's tiling " << spec_tiling);
  REQUIRE(untuned != spec_tiling);  // (the premise: a pick per pattern)
  TuneOptions options;
  options.warmup = 2;
  options.iterations = 5;
  options.budget_s = 20;
  const AttentionTuneReport report = tune_attention(spec, shape, options);

  CHECK(key(report.default_config) == untuned);
  REQUIRE(report.candidates.size() >= 3);
  CHECK(key(report.candidates[0].config) == untuned);
  CHECK(report.winner_us <= report.default_us);
  for (const AttentionTuneCandidate& c : report.candidates)
    if (c.rejected.empty()) CHECK(c.median_us >= report.winner_us);
  INFO("winner " << key(report.winner) << " " << report.winner_us << " us, default " << report.default_us << " us; "
                 << report.note);
  REQUIRE(report.stored);
  const bool pick_won = report.bucket == tuning::forward_pick_bucket(pattern.digest(), 2);
  CHECK(pick_won != report.note.empty());
  CHECK(tuned_attention_config(spec, s).has_value() == !pick_won);
  CHECK(picked(AutotunePolicy::on, pattern) == key(report.winner));
  if (!pick_won) return;  // a tiling of the grid beat every pick: stored for the spec (as dense specs')
  CHECK(picked(AutotunePolicy::on, other) == picked(AutotunePolicy::off, other));  // its own pick

  // The spec's tiling ("narrow") stored over the winner: taken for the pattern, with the policy on only.
  REQUIRE(tuning::store_forward_pick(report.spec, report.bucket, "narrow", 1, "narrow", 1, 2));
  CHECK(picked(AutotunePolicy::on, pattern) == spec_tiling);
  CHECK(picked(AutotunePolicy::off, pattern) == untuned);
}

namespace {

// Backward arguments of a tuning's shape over buffers of their own (what the backward chooses reads
// their shapes and pattern, not the data).
struct ShapeArgs {
  std::vector<DeviceBuffer> tensors;
  DeviceBuffer lse;
  AttentionBackwardArgs args;
  ShapeArgs(const AttentionSpec& spec, const AttentionTuneShape& shape) {
    const std::int64_t s = shape.seq_q;
    const std::size_t q_bytes = std::size_t(shape.heads_q * s * spec.head_dim) * 2,
                      kv_bytes = std::size_t(shape.heads_kv * s * spec.head_dim) * 2;
    for (const std::size_t bytes : {q_bytes, kv_bytes, kv_bytes, q_bytes, q_bytes, q_bytes, kv_bytes, kv_bytes})
      tensors.emplace_back(bytes);
    lse = DeviceBuffer(std::size_t(shape.heads_q * s) * 4);
    const auto& t = tensors;
    args.q = t[0].data(), args.k = t[1].data(), args.v = t[2].data(), args.o = t[3].data(), args.d_o = t[4].data();
    args.dq = t[5].data(), args.dk = t[6].data(), args.dv = t[7].data(), args.lse = lse.as<float>();
    args.batch = 1, args.heads_q = shape.heads_q, args.heads_kv = shape.heads_kv, args.seq_q = s, args.seq_k = s;
    args.pattern = shape.pattern;
  }
};

// tune_dq_summation times both ways on one problem and stores the faster for its bucket; a backward of
// that bucket then takes the stored way where the policy is on, and its own rule where it is off. To
// tell the stored way from the rule's, the loser is stored over the winner afterwards. `gathered`: the
// pattern runs the gathered backward, whose results have buckets of their own.
void check_dq_tuning(const AttentionSpec& spec, const AttentionTuneShape& shape, bool gathered) {
  TuneOptions options;
  options.warmup = 2;
  options.iterations = 10;
  const DqTuneReport report = tune_dq_summation(spec, shape, options);

  INFO("atomic " << report.atomic_us << " us, pass " << report.pass_us << " us, " << report.key_tiles_per_row
                 << " key tiles a row, " << report.bucket);
  CHECK(report.spec.pass == Pass::backward);
  CHECK(report.atomic_us > 0);
  CHECK(report.pass_us > 0);
  CHECK(report.winner == (report.atomic_us <= report.pass_us ? DqSummation::atomic : DqSummation::pass));
  // Sk / 128 key tiles of 128 a row when dense: the patterns leave some of them out.
  CHECK(report.key_tiles_per_row > 2);
  CHECK(report.key_tiles_per_row < 0.75 * double(shape.seq_k / 128));
  const std::int64_t group = shape.heads_q / shape.heads_kv;
  CHECK(report.bucket == tuning::dq_bucket(group, report.key_tiles_per_row, {.gathered = gathered}));
  CHECK((report.bucket.find("walk=gathered") != std::string::npos) == gathered);
  REQUIRE(report.stored);
  const auto entries = tuning_entries();
  const auto stored = std::find_if(entries.begin(), entries.end(), [&](const TunedEntry& e) {
    return e.op == "attention_dq" && e.spec_key == key(report.spec) && e.bucket == report.bucket;
  });
  REQUIRE(stored != entries.end());
  CHECK(stored->winner_config == name(report.winner));

  ShapeArgs problem(spec, shape);
  AttentionBackwardArgs& args = problem.args;
  CHECK((Attention(spec).backward_tiling(args).find("path=wgmma_gather") != std::string::npos) == gathered);

  const DqSummation loser = report.winner == DqSummation::atomic ? DqSummation::pass : DqSummation::atomic;
  REQUIRE(tuning::store_dq_result(report.spec, report.bucket, loser, 1, report.winner, 1));
  set_autotune_policy(AutotunePolicy::on);
  const DqSummation with_policy_on = Attention(spec).dq_summation(args);
  set_autotune_policy(AutotunePolicy::off);
  CHECK(name(with_policy_on) == name(loser));
  CHECK(name(Attention(spec).dq_summation(args)) == name(report.chosen_before));  // off: the rule, as before
  args.dq_summation = report.winner;  // the args still win
  set_autotune_policy(AutotunePolicy::on);
  const DqSummation asked = Attention(spec).dq_summation(args);
  set_autotune_policy(AutotunePolicy::off);
  CHECK(name(asked) == name(report.winner));
}

}  // namespace

TEST_CASE("tuning how dQ is summed stores the faster way, and a later backward of that bucket takes it",
          "[gpu][tune][attention][backward]") {
  AttentionSpec spec;
  spec.head_dim = 128;
  spec.sparsity = Sparsity::block_sparse;
  spec.block_size = 128;
  const std::int64_t s = 2048;
  const BlockPattern pattern = patterns::random(128, s, s, 0.25, 11);
  AttentionTuneShape shape;
  shape.batch = 1, shape.heads_q = 4, shape.heads_kv = 2, shape.seq_q = s, shape.seq_k = s;
  shape.pattern = &pattern;
  check_dq_tuning(spec, shape, false);
}

// Sparse random blocks of 16 run the gathered backward (on Hopper): its two ways are other kernels.
TEST_CASE("tuning how dQ is summed for a pattern on the gathered backward stores it in a bucket of its own",
          "[gpu][tune][attention][backward]") {
  if (!test::on_hopper("the gathered backward")) return;
  AttentionSpec spec;
  spec.head_dim = 128;
  spec.sparsity = Sparsity::block_sparse;
  spec.block_size = 16;
  const std::int64_t s = 4096;
  const BlockPattern pattern = patterns::random(16, s, s, 0.1, 12);
  AttentionTuneShape shape;
  shape.batch = 1, shape.heads_q = 2, shape.heads_kv = 1, shape.seq_q = s, shape.seq_k = s;
  shape.pattern = &pattern;
  check_dq_tuning(spec, shape, true);
}

TEST_CASE("tune_dq_summation refuses a spec that can only take the dQ pass, and a full pattern", "[gpu][tune][attention]") {
  AttentionSpec spec;
  spec.head_dim = 128;
  spec.deterministic = true;
  AttentionTuneShape shape;
  shape.heads_q = 2, shape.heads_kv = 2, shape.seq_q = 256, shape.seq_k = 256;
  CHECK_THROWS_WITH(tune_dq_summation(spec, shape), Contains("sums dQ only by its pass") && Contains("deterministic"));
  spec.deterministic = false;
  spec.sparsity = Sparsity::block_sparse;
  spec.block_size = 128;
  shape.density = 1;
  CHECK_THROWS_WITH(tune_dq_summation(spec, shape), Contains("density = 1") && Contains("tune the dense spec"));
}

// tune_backward_walk times every walk, query tile width and way of summing dQ a pattern can take (at
// d = 64 with blocks of 32: tiles and packed on 64- and 128-query tiles, and gathered, each way: 10)
// and stores the fastest for that pattern and group; a later backward of that pattern and group takes
// the stored choice where the policy is on, and the rules where it is off or the pattern is another.
// To tell the stored choice from the rules', another candidate is stored over the winner afterwards.
TEST_CASE("tuning how the backward walks a pattern stores the fastest way, and a later backward of that pattern "
          "takes it",
          "[gpu][tune][attention][backward]") {
  if (!test::on_hopper("the backward's walks")) return;
  const AttentionSpec spec = test::spec_of(64, DType::bf16, Causal::none, Sparsity::block_sparse, 32);
  const std::int64_t s = 2048;
  const BlockPattern pattern = patterns::random(32, s, s, 0.1, 13);
  AttentionTuneShape shape;
  shape.batch = 1, shape.heads_q = 4, shape.heads_kv = 2, shape.seq_q = s, shape.seq_k = s;
  shape.pattern = &pattern;
  TuneOptions options;
  options.warmup = 2;
  options.iterations = 5;
  const WalkTuneReport report = tune_backward_walk(spec, shape, options);

  REQUIRE(report.candidates.size() == 10);
  CHECK(report.not_runnable == 0);
  CHECK(report.spec.pass == Pass::backward);
  CHECK(report.pattern_digest == pattern.digest());
  CHECK(report.bucket == tuning::walk_bucket(pattern.digest(), 2));
  auto choice = [](const WalkTuneCandidate& c) { return tuning::TunedWalk{c.walk, c.query_tile_cols, c.dq}; };
  for (const WalkTuneCandidate& c : report.candidates) {
    INFO(tuning::walk_choice_text(choice(c)) << ": " << c.median_us << " us, " << c.tiling);
    CHECK(c.median_us > 0);
    CHECK(c.median_us >= report.candidates[report.winner].median_us);
    CHECK((c.walk == BackwardWalk::gathered) == (c.query_tile_cols == 0));
  }
  REQUIRE(report.stored);
  const auto entries = tuning_entries();
  const auto stored = std::find_if(entries.begin(), entries.end(), [&](const TunedEntry& e) {
    return e.op == "attention_walk" && e.spec_key == key(report.spec) && e.bucket == report.bucket;
  });
  REQUIRE(stored != entries.end());
  CHECK(stored->winner_config == tuning::walk_choice_text(choice(report.candidates[report.winner])));
  CHECK(stored->default_config == tuning::walk_choice_text(choice(report.candidates[0])));

  // Another candidate than the winner and the one chosen before, stored over the winner.
  const auto other = std::find_if(report.candidates.begin() + 1, report.candidates.end(), [&](const WalkTuneCandidate& c) {
    return &c != &report.candidates[report.winner];
  });
  REQUIRE(other != report.candidates.end());
  REQUIRE(tuning::store_walk_result(report.spec, report.bucket, choice(*other), 1, choice(report.candidates[0]), 1, 10));
  ShapeArgs problem(spec, shape);
  AttentionBackwardArgs& args = problem.args;
  auto chosen = [&](AutotunePolicy policy, const AttentionBackwardArgs& a) {
    const PolicyScope scope(policy);
    Attention attention(spec);
    const tuning::TunedWalk c{attention.backward_walk(a), 0, attention.dq_summation(a)};
    return std::pair{c, attention.backward_tiling(a)};
  };
  auto same = [](const std::pair<tuning::TunedWalk, std::string>& got, const WalkTuneCandidate& want) {
    return got.first.walk == want.walk && got.first.dq == want.dq && got.second == want.tiling;
  };
  CHECK(same(chosen(AutotunePolicy::on, args), *other));
  CHECK(same(chosen(AutotunePolicy::off, args), report.candidates[0]));  // off: the rules, as before
  // Asked in the args, the walk is the args' (and nothing of the stored choice is taken).
  AttentionBackwardArgs asked = args;
  asked.walk = report.candidates[0].walk;
  asked.query_tile_cols = report.candidates[0].query_tile_cols;
  CHECK(chosen(AutotunePolicy::on, asked).first.walk == report.candidates[0].walk);
  // Another pattern, another group: the rules.
  const BlockPattern another = patterns::random(32, s, s, 0.1, 14);
  AttentionBackwardArgs other_pattern = args;
  other_pattern.pattern = &another;
  CHECK(chosen(AutotunePolicy::on, other_pattern) == chosen(AutotunePolicy::off, other_pattern));
  AttentionBackwardArgs other_group = args;
  other_group.heads_q = 2;  // one query head a K/V head (within the buffers: they must not overlap)
  CHECK(chosen(AutotunePolicy::on, other_group) == chosen(AutotunePolicy::off, other_group));
}
