#include "e23/e23_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "templates/sparsejit/e23_params.cuh"

namespace sjit::e23 {
namespace {

using namespace sjit_kernels;

// Short names of the points, in E23Mark / E23BackwardMark / E23BackwardLaunchMark order.
constexpr std::array<const char*, kE23Marks> kMarkNames = {
    "tile: start", "tile: h ready", "tile: partial products", "tile: products stored",
    "tape: start", "tape: z, w arrived", "tape: read weights", "tape: h signalled", "tape: write weights"};
constexpr std::array<const char*, kE23BackwardMarks> kBackwardMarkNames = {
    "rec: start", "rec: g_z(t+1) ready", "rec: W_h^T g_z stored", "grad: start", "grad: tape items ready",
    "grad: g_z(t) stored, signalled", "tape: start", "tape: before poll", "tape: g_z(t+1) arrived",
    "tape: Jacobians", "tape: signalled", "tape: replayed"};
constexpr std::array<const char*, kE23BackwardLaunchMarks> kLaunchMarkNames = {
    "launch: start", "launch: steps begin", "launch: steps end", "launch: dW begin", "launch: end"};

// A figure across CTAs on the global timer: from the last CTA to reach point `from` of step t + from_step
// to the first to reach point `to` of step t (a hand-over from producers to consumers).
struct CrossSpan {
  int from, to, from_step;
  const char* name;
};

// Where the marks are and what to make of them.
struct Layout {
  int grid;
  std::int64_t batch, slots;     // step slots per CTA
  int marks;                     // points per slot
  const char* const* names;      // of the points
  std::int64_t first, last;      // the steps to average over, [first, last)
  std::vector<CrossSpan> cross;
};

struct Accum {
  double sum_ns = 0;
  long count = 0;
};

// Per role (tape CTAs: c < batch; tile CTAs), the mean over steps and CTAs of the time between consecutive
// points a CTA reached, and of its whole step (first point to last); then the cross-CTA hand-overs, the
// SM clock and the global timer's resolution.
std::vector<E23ProfileSpan> summarize(const std::vector<unsigned long long>& marks, const Layout& l) {
  auto at = [&](int cta, std::int64_t t, int mark, int word) {
    return marks[std::size_t(((std::int64_t(cta) * l.slots + t) * l.marks + mark) * 2 + word)];
  };
  std::map<std::pair<std::string, std::string>, std::vector<double>> per_cta;
  std::vector<std::string> order;  // role|span in first-seen order
  auto note = [&](const std::string& key) {
    if (std::find(order.begin(), order.end(), key) == order.end()) order.push_back(key);
  };
  unsigned long long resolution = std::numeric_limits<unsigned long long>::max();
  std::vector<double> clock_mhz;  // per CTA: its SM's clock over the launch
  for (int cta = 0; cta < l.grid; ++cta) {
    const std::string role = cta < l.batch ? "tape" : "tile";
    // Cycles to ns for this CTA's SM, from its whole launch (first and last point in time).
    unsigned long long c0 = std::numeric_limits<unsigned long long>::max(), n0 = 0, c1 = 0, n1 = 0;
    for (std::int64_t t = 0; t < l.slots; ++t)
      for (int m = 0; m < l.marks; ++m) {
        const unsigned long long c = at(cta, t, m, 0), n = at(cta, t, m, 1);
        if (c == 0) continue;
        if (c < c0) c0 = c, n0 = n;
        if (c > c1) c1 = c, n1 = n;
      }
    if (c0 == std::numeric_limits<unsigned long long>::max() || c1 <= c0 || n1 <= n0) continue;
    const double ns_per_cycle = double(n1 - n0) / double(c1 - c0);
    clock_mhz.push_back(1e3 / ns_per_cycle);
    std::map<std::string, Accum> spans;
    for (std::int64_t t = l.first; t < l.last; ++t) {
      int prev = -1, first = -1, last = -1;
      for (int m = 0; m < l.marks; ++m) {
        if (at(cta, t, m, 0) == 0) continue;
        last = m, first = first < 0 ? m : first;
        if (prev >= 0) {
          const std::string name = fmt::format("{} -> {}", l.names[prev], l.names[m]);
          Accum& a = spans[name];
          a.sum_ns += double(at(cta, t, m, 0) - at(cta, t, prev, 0)) * ns_per_cycle;
          ++a.count;
          note(role + "|" + name);
          const unsigned long long dn = at(cta, t, m, 1) - at(cta, t, prev, 1);
          if (dn > 0) resolution = std::min(resolution, dn);
        }
        prev = m;
      }
      if (first >= 0 && last > first) {
        Accum& a = spans["whole step"];
        a.sum_ns += double(at(cta, t, last, 0) - at(cta, t, first, 0)) * ns_per_cycle;
        ++a.count;
        note(role + "|whole step");
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
  for (const CrossSpan& c : l.cross) {
    double sum = 0, mx = 0;
    long count = 0;
    for (std::int64_t t = l.first; t < l.last; ++t) {
      const std::int64_t tf = t + c.from_step;
      if (tf < 0 || tf >= l.slots) continue;
      unsigned long long last_in = 0, first_out = std::numeric_limits<unsigned long long>::max();
      for (int cta = 0; cta < l.grid; ++cta) {
        if (at(cta, tf, c.from, 1) != 0) last_in = std::max(last_in, at(cta, tf, c.from, 1));
        if (at(cta, t, c.to, 1) != 0) first_out = std::min(first_out, at(cta, t, c.to, 1));
      }
      if (last_in == 0 || first_out == std::numeric_limits<unsigned long long>::max()) continue;
      const double d = double(first_out) - double(last_in);
      sum += d, mx = std::max(mx, d), ++count;
    }
    if (count > 0) out.push_back({"grid", c.name, sum / double(count), mx});
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

}  // namespace

std::vector<E23ProfileSpan> summarize_profile(const std::vector<unsigned long long>& marks, int grid,
                                              std::int64_t batch, std::int64_t steps) {
  Layout l{grid, batch, steps, kE23Marks, kMarkNames.data(), steps > 1 ? 1 : 0, steps, {}};  // step 0 also loads m0
  l.cross = {{kMarkTileDone, kMarkTapeGo, 0, "last tile stored -> first tape going on"},
             {kMarkTapeSignalled, kMarkTileGo, -1, "last tape signal -> first tile going on (next step)"}};
  return summarize(marks, l);
}

std::vector<E23ProfileSpan> summarize_backward_profile(const std::vector<unsigned long long>& marks, int grid,
                                                       std::int64_t batch, std::int64_t steps) {
  // Steps T - 2 .. 0 (the first undone, T - 1, has no read to undo and no g_z to wait for).
  Layout l{grid, batch, steps + 1, kE23BackwardMarks, kBackwardMarkNames.data(), 0, steps > 1 ? steps - 1 : steps, {}};
  l.cross = {{kBMarkGradDone, kBMarkTapeGo, 1, "last grad tile g_z(t+1) stored -> first tape going on"},
             {kBMarkGradDone, kBMarkRecGo, 1, "last grad tile g_z(t+1) signalled -> first rec tile going on"},
             {kBMarkTapeSignalled, kBMarkGradGo, 0, "last tape signal -> first grad tile going on"}};
  std::vector<E23ProfileSpan> out = summarize(marks, l);
  // The launch's own points: slot `steps` of every CTA (only its first kE23BackwardLaunchMarks are written).
  Layout whole{grid, batch, steps + 1, kE23BackwardMarks, kLaunchMarkNames.data(), steps, steps + 1, {}};
  for (E23ProfileSpan& s : summarize(marks, whole))
    if (s.role != "grid") out.push_back({"launch (" + s.role + " CTAs)", s.span, s.ns_per_step, s.max_ns});
  return out;
}

}  // namespace sjit::e23
