// The autotuner on the GPU: it never picks a slower or a wrong layout, and launches use what it stored.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "sparsejit/sparsejit.h"
#include "support/test_support.h"

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
