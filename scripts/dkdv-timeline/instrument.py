#!/usr/bin/env python3
"""Instruments a copy of the source tree for report.py (a measuring tool, never for main's kernels).

  mkdir .snap-tl && git archive HEAD | tar -x -C .snap-tl
  python3 scripts/dkdv-timeline/instrument.py .snap-tl
  # on the GPU machine, carrying .snap-tl:
  cmake -S .snap-tl -B .snap-tl/build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build .snap-tl/build-gpu --target sjit
  SJIT_TIMELINE=$OUT/tl .snap-tl/build-gpu/sjit bench attention --backward --iters 3 --density 0.1
  python3 scripts/dkdv-timeline/report.py $OUT/tl.sparse $OUT/tl.dense

Each edit names the text it expects; where the kernel has changed since, it stops and says which.
"""
import sys
root=sys.argv[1]
def patch(p, pairs):
    s=open(p).read()
    for a,b in pairs:
        if a not in s: sys.exit(f'instrument.py: {p} no longer has the text:\n{a}')
        s=s.replace(a,b,1)
    open(p,'w').write(s)
patch(root+'/templates/sparsejit/attention_params.cuh', [("""  int tail_groups;
};""", """  int tail_groups;
  unsigned long long* timeline;
};""")])
patch(root+'/src/attention/attention.cpp', [("""  if (rows > 0)
    jit::launch(*kernels.prep,""","""  static DeviceBuffer timeline;
  const char* timeline_path = std::getenv("SJIT_TIMELINE");
  if (timeline_path && kv_grid > 0) {
    if (timeline.bytes() < std::size_t(kv_grid) * 128) timeline = DeviceBuffer(std::size_t(kv_grid) * 128);
    timeline.fill_bytes(0, stream);
    p.timeline = timeline.as<unsigned long long>();
  }
  if (rows > 0)
    jit::launch(*kernels.prep,"""), ("""    if (atomic) state_->mark_zeroed_scratch_stale(target, stream);  // the adds may have run, unconverted
    throw;
  }
}""","""    if (atomic) state_->mark_zeroed_scratch_stale(target, stream);  // the adds may have run, unconverted
    throw;
  }
  if (p.timeline) {
    synchronize(stream);
    std::vector<unsigned long long> host(std::size_t(kv_grid) * 16);
    timeline.download(host.data(), host.size() * 8);
    const std::string path = fmt::format("{}.{}", timeline_path, key_schedule ? "sparse" : "dense");
    if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
      std::fwrite(host.data(), 8, host.size(), f);
      std::fclose(f);
    }
  }
}"""), ("#include <cstring>\n","#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n")])
patch(root+'/templates/sparsejit/attention_backward_sm90.cuh', [
("""template <class Cfg>
__global__ void __launch_bounds__(BackwardSm90Layout<Cfg>::threads, 1)""","""__device__ __forceinline__ unsigned long long tl_now() {
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}
#define TL(slot, value) do { if (p.timeline) p.timeline[blockIdx.x * 16ull + (slot)] = (value); } while (0)

template <class Cfg>
__global__ void __launch_bounds__(BackwardSm90Layout<Cfg>::threads, 1)"""),
("""  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);""","""  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    TL(0, sm);
    TL(1, tl_now());
  }
  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);"""),
("""  const int count = has_keys ? walk.build(p, own) : 0;  // build() ends with a __syncthreads
""","""  const int count = has_keys ? walk.build(p, own) : 0;  // build() ends with a __syncthreads
  if (threadIdx.x == 0) { TL(2, tl_now()); TL(9, count); }
"""),
("""        load_row_stats<C, 32>(lse2_ring + slot * C, delta_ring + slot * C, p, own.batch, t.head_q, q0, lane);
        mbarrier_arrive(full);
      }
""","""        load_row_stats<C, 32>(lse2_ring + slot * C, delta_ring + slot * C, p, own.batch, t.head_q, q0, lane);
        mbarrier_arrive(full);
      }
      if (lane == 0) TL(12, tl_now());
"""),
("""      count_group_done(p.groups_done + own.group);
""","""      count_group_done(p.groups_done + own.group);
      TL(7, tl_now());
"""),
("""      convert_earlier_group<Cfg>(p, own.group - p.convert_lag, own.rank, own.ranks, threadIdx.x % 64, smem, base);
    }""","""      convert_earlier_group<Cfg>(p, own.group - p.convert_lag, own.rank, own.ranks, threadIdx.x % 64, smem, base);
      if (threadIdx.x % 64 == 0) TL(8, tl_now());
    }"""),
("""  if (has_keys) mbarrier_wait(barrier(L::kv_ready), 0);
""","""  if (has_keys) mbarrier_wait(barrier(L::kv_ready), 0);
  if (threadIdx.x == 0) TL(3, tl_now());
  long long full_wait = 0, dq_wait = 0;
"""),
("""    mbarrier_wait(barrier(L::slot_full + slot), (j / stages) & 1);  // tile j's Q, dO and statistics
""","""    const long long c0 = clock64();
    mbarrier_wait(barrier(L::slot_full + slot), (j / stages) & 1);  // tile j's Q, dO and statistics
    if (j == 0) { if (threadIdx.x == 0) { TL(4, tl_now()); TL(13, clock64()); } } else full_wait += clock64() - c0;
"""),
("""      if (j > 0) mbarrier_wait(barrier(L::dq_empty + group), (j - 1) & 1);
""","""      const long long c1 = clock64();
      if (j > 0) mbarrier_wait(barrier(L::dq_empty + group), (j - 1) & 1);
      dq_wait += clock64() - c1;
"""),
("""  named_barrier(L::math_barrier, L::math_threads);  // every math warp is done with the tiles staged over
""","""  if (threadIdx.x == 0) { TL(5, tl_now()); TL(10, full_wait); TL(11, dq_wait); TL(15, clock64()); }
  if (threadIdx.x == 128) TL(14, tl_now());
  named_barrier(L::math_barrier, L::math_threads);  // every math warp is done with the tiles staged over
"""),
("""  store_rows<Tr>(dv, 1.f, staging + L::staging_elems, dv_out, p.dv_row_stride, own.key0, p.seq_k, warp_row0);
}""","""  store_rows<Tr>(dv, 1.f, staging + L::staging_elems, dv_out, p.dv_row_stride, own.key0, p.seq_k, warp_row0);
  if (threadIdx.x == 0) TL(6, tl_now());
}""")])
