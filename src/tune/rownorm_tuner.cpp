// Tuning the row normalizers: every layout of the op's space, timed on this device.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "jit/jit.h"
#include "sparsejit/cache.h"
#include "sparsejit/error.h"
#include "sparsejit/tune.h"
#include "tune/tuned_configs.h"
#include "tune/tuner_support.h"
#include "tune/tuning_db.h"

namespace sjit {
namespace {

using Clock = std::chrono::steady_clock;

bool same_layout(const RowNormConfig& a, const RowNormConfig& b) { return key(a) == key(b); }

// Buffers for one timing: `sets` copies of the inputs, rotated so that a problem smaller than L2 is
// not timed from L2, and one output per set.
struct Workspace {
  RowNormSpec spec;
  std::int64_t rows = 0;
  std::size_t bytes = 0;
  int sets = 1;
  std::vector<DeviceBuffer> in, in2, out;  // fwd: x, -, y; bwd: y, dy, dx

  Workspace(const RowNormSpec& s, std::int64_t r, int l2_bytes) : spec(s), rows(r) {
    bytes = std::size_t(rows) * spec.n * size_of(spec.dtype);
    const int arrays = spec.pass == Pass::forward ? 2 : 3;
    sets = int(std::clamp<std::size_t>(2 * std::size_t(l2_bytes) / (bytes * arrays) + 1, 1, 8));
    std::mt19937_64 rng(0x5eed);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> host(std::size_t(rows) * spec.n);
    std::vector<unsigned char> raw(bytes);
    auto random_buffer = [&] {
      for (float& v : host) v = dist(rng);
      encode(spec.dtype, host, raw.data());
      DeviceBuffer b(bytes);
      b.upload(raw.data(), bytes);
      return b;
    };
    for (int s = 0; s < sets; ++s) {
      in.push_back(random_buffer());
      out.emplace_back(bytes);
      if (spec.pass == Pass::backward) {
        in2.push_back(random_buffer());
        // y must be a distribution the forward could have made: normalize the random scores.
        const RowNormSpec fwd = with_forward(spec);  // an explicit layout: no tuning lookup from here
        RowNorm(fwd, resolve(fwd, {})).forward({in.back().data(), in.back().data(), rows});
      }
    }
    synchronize();
  }

  static RowNormSpec with_forward(RowNormSpec s) {
    s.pass = Pass::forward;
    return s;
  }

  void run(RowNorm& op, int set) {
    if (spec.pass == Pass::forward) op.forward({in[set].data(), out[set].data(), rows});
    else op.backward({in[set].data(), in2[set].data(), out[set].data(), rows});
  }

  std::vector<float> output(int set) const {
    std::vector<unsigned char> raw(bytes);
    out[set].download(raw.data(), bytes);
    std::vector<float> values(std::size_t(rows) * spec.n);
    decode(spec.dtype, raw.data(), values);
    return values;
  }
};

double time_candidate(Workspace& w, RowNorm& op, const TuneOptions& o) {
  return tuning::median_launch_us(o.warmup, o.iterations, [&](int i) { w.run(op, i % w.sets); });
}

}  // namespace

std::vector<RowNormConfig> rownorm_candidates(const RowNormSpec& spec_in) {
  const RowNormSpec spec = canonical(spec_in);
  const RowNormConfig fallback = resolve(spec, {});
  std::vector<RowNormConfig> out = {fallback};
  auto add = [&](RowNormConfig c) {
    try {
      c = resolve(spec, c);
    } catch (const InvalidArgument&) {
      return;  // not a layout this spec can have
    }
    if (std::none_of(out.begin(), out.end(), [&](const RowNormConfig& o) { return same_layout(o, c); })) out.push_back(c);
  };
  for (int vec = fallback.vec; vec >= std::max(1, fallback.vec / 2); vec /= 2)
    for (int tpr = 1; tpr <= 1024; tpr *= 2) {
      if (tpr <= 32) {
        for (int block : {128, 256, 512}) add({tpr, vec, block, 0});
      } else {
        add({tpr, vec, tpr, 0});
        add({tpr, vec, tpr, 1});
      }
    }
  return out;
}

TuneReport tune_rownorm(const RowNormSpec& spec_in, const TuneOptions& o) {
  const RowNormSpec spec = canonical(spec_in);
  const DeviceInfo dev = current_device();
  TuneReport report;
  report.spec = spec;
  report.rows = o.rows > 0 ? o.rows : std::max<std::int64_t>(1, (16ll << 20) / spec.n);
  report.bucket = tune::shape_bucket(report.rows);
  report.device = dev.name;
  report.default_config = resolve(spec, {});

  std::vector<RowNormConfig> layouts = rownorm_candidates(spec);
  for (const RowNormConfig& c : o.extra_candidates) layouts.push_back(resolve(spec, c));

  // Compile everything first, in parallel, through the disk cache; a failure only rejects that layout.
  std::vector<std::string> compile_errors(layouts.size());
  tuning::run_in_parallel(layouts.size(), [&](std::size_t i) {
    try {
      compile_key(key(spec) + "|" + key(layouts[i]), dev.arch);
    } catch (const std::exception& e) {
      compile_errors[i] = fmt::format("compile: {}", e.what());
    }
  });

  Workspace w(spec, report.rows, current_device().l2_bytes);
  const double bytes_moved = double(w.bytes) * (spec.pass == Pass::forward ? 2 : 3);
  std::vector<float> reference;
  const auto start = Clock::now();
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    TuneCandidate c{layouts[i]};
    const bool is_default = i == 0;
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    if (!compile_errors[i].empty()) {
      c.rejected = compile_errors[i];
    } else if (!is_default && elapsed_s > o.budget_s) {
      c.rejected = fmt::format("not timed: the {:.0f} s budget was spent", o.budget_s);
    } else {
      try {
        RowNorm op(spec, layouts[i]);
        w.out[0].fill_bytes(0xFF);  // poison: an unwritten element cannot match
        w.run(op, 0);
        synchronize();
        const std::vector<float> got = w.output(0);
        if (is_default) reference = got;
        else if (std::string diff = tuning::compare_rows(spec.dtype, spec.n, got, reference); !diff.empty())
          c.rejected = "wrong output: " + diff;
        if (c.rejected.empty()) {
          c.median_us = time_candidate(w, op, o);
          c.gb_per_s = bytes_moved / c.median_us / 1e3;
        }
      } catch (const DriverError& e) {
        c.rejected = fmt::format("launch: {}", e.what());
      }
    }
    report.candidates.push_back(c);
    if (o.progress) o.progress(int(i + 1), int(layouts.size()), key(layouts[i]));
  }
  const TuneCandidate& def = report.candidates.front();
  if (!def.rejected.empty()) throw Error(fmt::format("tuning {}: the default layout failed: {}", key(spec), def.rejected));
  report.default_us = def.median_us;
  report.winner = def.config;
  report.winner_us = def.median_us;
  for (const TuneCandidate& c : report.candidates)
    if (c.rejected.empty() && c.median_us < report.winner_us) report.winner = c.config, report.winner_us = c.median_us;
  if (o.store) {
    int timed = 0;
    for (const TuneCandidate& c : report.candidates) timed += c.rejected.empty();
    report.stored = tuning::store_result(spec, report.bucket, report.winner, report.winner_us, report.default_config,
                                         report.default_us, timed);
  }
  return report;
}

}  // namespace sjit
