#include "e23/e23_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "templates/sparsejit/e23_params.cuh"

namespace sjit::e23 {
namespace {

using sjit_kernels::kE23Marks;

// Short names of the points, in E23Mark order.
constexpr std::array<const char*, kE23Marks> kMarkNames = {
    "tile: start", "tile: h ready", "tile: partial products", "tile: products stored",
    "tape: start", "tape: z, w arrived", "tape: read weights", "tape: h signalled", "tape: write weights"};

struct Accum {
  double sum_ns = 0;
  long count = 0;
};

}  // namespace

std::vector<E23ProfileSpan> summarize_profile(const std::vector<unsigned long long>& marks, int grid,
                                              std::int64_t batch, std::int64_t steps) {
  auto at = [&](int cta, std::int64_t t, int mark, int word) {
    return marks[std::size_t(((std::int64_t(cta) * steps + t) * kE23Marks + mark) * 2 + word)];
  };
  const std::int64_t first_step = steps > 1 ? 1 : 0;  // step 0 also loads m0: not typical
  // Per role: (span name) -> per-CTA means.
  std::map<std::pair<std::string, std::string>, std::vector<double>> per_cta;
  std::vector<std::string> order;  // span names in first-seen order, per role
  unsigned long long resolution = std::numeric_limits<unsigned long long>::max();
  std::vector<double> clock_mhz;  // per CTA: its SM's clock over the launch
  for (int cta = 0; cta < grid; ++cta) {
    const std::string role = cta < batch ? "tape" : "tile";
    // Cycles to ns for this CTA's SM, from its whole launch.
    unsigned long long c0 = 0, n0 = 0, c1 = 0, n1 = 0;
    for (std::int64_t t = 0; t < steps; ++t)
      for (int m = 0; m < kE23Marks; ++m) {
        const unsigned long long c = at(cta, t, m, 0), n = at(cta, t, m, 1);
        if (c == 0) continue;
        if (c0 == 0) c0 = c, n0 = n;
        c1 = c, n1 = n;
      }
    if (c1 <= c0 || n1 <= n0) continue;
    const double ns_per_cycle = double(n1 - n0) / double(c1 - c0);
    clock_mhz.push_back(1e3 / ns_per_cycle);
    std::map<std::string, Accum> spans;
    for (std::int64_t t = first_step; t < steps; ++t) {
      int prev = -1;
      for (int m = 0; m < kE23Marks; ++m) {
        if (at(cta, t, m, 0) == 0) continue;
        if (prev >= 0) {
          const std::string name = fmt::format("{} -> {}", kMarkNames[prev], kMarkNames[m]);
          Accum& a = spans[name];
          a.sum_ns += double(at(cta, t, m, 0) - at(cta, t, prev, 0)) * ns_per_cycle;
          ++a.count;
          if (std::find(order.begin(), order.end(), role + "|" + name) == order.end()) order.push_back(role + "|" + name);
          const unsigned long long dn = at(cta, t, m, 1) - at(cta, t, prev, 1);
          if (dn > 0) resolution = std::min(resolution, dn);
        }
        prev = m;
      }
      // The whole step, first point to last.
      int first = -1, last = -1;
      for (int m = 0; m < kE23Marks; ++m)
        if (at(cta, t, m, 0) != 0) last = m, first = first < 0 ? m : first;
      if (first >= 0 && last > first) {
        Accum& a = spans["whole step"];
        a.sum_ns += double(at(cta, t, last, 0) - at(cta, t, first, 0)) * ns_per_cycle;
        ++a.count;
        if (std::find(order.begin(), order.end(), role + "|whole step") == order.end())
          order.push_back(role + "|whole step");
      }
    }
    for (const auto& [name, a] : spans) per_cta[{role, name}].push_back(a.sum_ns / double(a.count));
  }
  std::vector<E23ProfileSpan> out;
  for (const std::string& key : order) {
    const std::size_t bar = key.find('|');
    const std::string role = key.substr(0, bar), name = key.substr(bar + 1);
    const std::vector<double>& v = per_cta[{role, name}];
    double sum = 0, mx = 0;
    for (double x : v) sum += x, mx = std::max(mx, x);
    out.push_back({role, name, sum / double(v.size()), mx});
  }
  // Across CTAs, on the global timer: from the last producer's stores (or signal) to the first consumer going on.
  using sjit_kernels::kMarkTapeGo, sjit_kernels::kMarkTapeSignalled, sjit_kernels::kMarkTileGo,
      sjit_kernels::kMarkTileDone;
  for (const auto& [from, to, next_step, name] :
       {std::tuple{kMarkTileDone, kMarkTapeGo, 0, "last tile stored -> first tape going on"},
        std::tuple{kMarkTapeSignalled, kMarkTileGo, 1, "last tape signal -> first tile going on (next step)"}}) {
    double sum = 0, mx = 0;
    long count = 0;
    for (std::int64_t t = first_step; t + next_step < steps; ++t) {
      unsigned long long last_in = 0, first_out = std::numeric_limits<unsigned long long>::max();
      for (int cta = 0; cta < grid; ++cta) {
        if (at(cta, t, from, 1) != 0) last_in = std::max(last_in, at(cta, t, from, 1));
        if (at(cta, t + next_step, to, 1) != 0) first_out = std::min(first_out, at(cta, t + next_step, to, 1));
      }
      if (last_in == 0 || first_out == std::numeric_limits<unsigned long long>::max()) continue;
      const double d = double(first_out) - double(last_in);
      sum += d, mx = std::max(mx, d), ++count;
    }
    if (count > 0) out.push_back({"grid", name, sum / double(count), mx});
  }
  if (!clock_mhz.empty()) {
    double sum = 0, mx = 0;
    for (double c : clock_mhz) sum += c, mx = std::max(mx, c);
    out.push_back({"grid", "SM clock during the launch (MHz, not ns)", sum / double(clock_mhz.size()), mx});
  }
  if (resolution != std::numeric_limits<unsigned long long>::max())
    out.push_back({"grid", "global timer resolution (smallest step seen)", double(resolution), double(resolution)});
  return out;
}

}  // namespace sjit::e23
