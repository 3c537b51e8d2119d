#!/usr/bin/env python3
"""Instruments a copy of the source tree for report.py: where the persistent forward's time goes.

  mkdir .snap-ftl && git archive HEAD | tar -x -C .snap-ftl
  python3 scripts/forward-timeline/instrument.py .snap-ftl
  # on the GPU machine, carrying .snap-ftl:
  cmake -S .snap-ftl -B .snap-ftl/build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build .snap-ftl/build-gpu --target sjit
  SJIT_FTIMELINE=$OUT/ftl .snap-ftl/build-gpu/sjit bench attention --iters 3 --density 0.1
  python3 scripts/forward-timeline/report.py $OUT/ftl.sparse $OUT/ftl.dense

The wgmma_ws kernel's math thread 0 stamps %globaltimer when each item's Q and record are ready, when
its walk is done (and its tile count) and when its output is staged; the copy thread when it is done.
512 words a CTA (up to 126 items). Each edit names the text it expects; where the code has changed since, it
stops and says which.
"""
import sys
root = sys.argv[1]


def patch(p, pairs):
    s = open(p).read()
    for a, b in pairs:
        if a not in s:
            sys.exit(f'instrument.py: {p} no longer has the text:\n{a}')
        s = s.replace(a, b, 1)
    open(p, 'w').write(s)


patch(root + '/templates/sparsejit/attention_params.cuh', [("""  int work_items;                           // (batch, head, query tile) items: one CTA each, or shared
                                            // out among the persistent kernel's CTAs
};""", """  int work_items;                           // (batch, head, query tile) items: one CTA each, or shared
                                            // out among the persistent kernel's CTAs
  unsigned long long* timeline;
};""")])
patch(root + '/src/attention/attention.cpp', [("""  void* params[] = {&p, &maps};
  jit::launch(kernel, unsigned(grid), unsigned(forward_threads(config)), reinterpret_cast<CUstream>(stream), params);
}""", """  static DeviceBuffer timeline;
  const char* timeline_path = std::getenv("SJIT_FTIMELINE");
  if (timeline_path) {
    if (timeline.bytes() < std::size_t(grid) * 4096) timeline = DeviceBuffer(std::size_t(grid) * 4096);
    timeline.fill_bytes(0, stream);
    p.timeline = timeline.as<unsigned long long>();
  }
  void* params[] = {&p, &maps};
  jit::launch(kernel, unsigned(grid), unsigned(forward_threads(config)), reinterpret_cast<CUstream>(stream), params);
  if (p.timeline) {
    synchronize(stream);
    std::vector<unsigned long long> host(std::size_t(grid) * 512);
    timeline.download(host.data(), host.size() * 8);
    const std::string path = fmt::format("{}.{}", timeline_path, spec.sparsity == Sparsity::dense ? "dense" : "sparse");
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(host.data(), 8, host.size(), f);
      std::fclose(f);
    }
  }
}"""), ("#include <cstring>\n", "#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n")])
patch(root + '/templates/sparsejit/attention_forward_sm90_ws.cuh', [
("""template <class Cfg>
__global__ void __launch_bounds__(AttentionWsLayout<Cfg>::threads, 1)""", """__device__ __forceinline__ unsigned long long ftl_now() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
#define FTL(slot, value) do { if (p.timeline && (slot) < 512) p.timeline[blockIdx.x * 512ull + (slot)] = (value); } while (0)

template <class Cfg>
__global__ void __launch_bounds__(AttentionWsLayout<Cfg>::threads, 1)"""),
("""  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {""", """  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    FTL(0, sm);
    FTL(1, ftl_now());
  }
  if (threadIdx.x == 0) {
    for (int b = 0; b < 2; ++b) {"""),
("""    bulk_wait_done();
    return;
  }""", """    bulk_wait_done();
    FTL(4, ftl_now());
    return;
  }"""),
("""    const int count = item_records[b].count;
    if (count < 0) break;""", """    const int count = item_records[b].count;
    if (threadIdx.x == 0) { FTL(8 + 4 * n, ftl_now()); FTL(3, n); }
    if (count < 0) break;"""),
("""    tiles_seen += count;
""", """    tiles_seen += count;
    if (threadIdx.x == 0) { FTL(8 + 4 * n + 1, ftl_now()); FTL(8 + 4 * n + 3, count); }
"""),
("""    mbarrier_arrive(barrier(L::q_empty + b));
  }
}""", """    mbarrier_arrive(barrier(L::q_empty + b));
    if (threadIdx.x == 0) FTL(8 + 4 * n + 2, ftl_now());
  }
  if (threadIdx.x == 0) FTL(2, ftl_now());
}""")])
