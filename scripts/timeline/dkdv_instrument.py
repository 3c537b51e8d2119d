#!/usr/bin/env python3
"""Instruments a copy of the source tree for dkdv_report.py (a measuring tool, never for main's kernels).

  mkdir .snap-tl && git archive HEAD | tar -x -C .snap-tl
  python3 scripts/timeline/dkdv_instrument.py .snap-tl
  # on the GPU machine, carrying .snap-tl:
  cmake -S .snap-tl -B .snap-tl/build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build .snap-tl/build-gpu --target sjit
  SJIT_TIMELINE=$OUT/tl .snap-tl/build-gpu/sjit bench attention --backward --iters 3 --density 0.1
  python3 scripts/timeline/dkdv_report.py $OUT/tl.sparse $OUT/tl.dense

Each edit names the text it expects; where the kernel has changed since, it stops and says which.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import HOST_INCLUDES, device_stamps, host_dump, host_setup, patch  # noqa: E402

WORDS = 16
root=sys.argv[1]
patch(root+'/templates/sparsejit/attention_params.cuh', [("""  int tail_groups;
};""", """  int tail_groups;
  unsigned long long* timeline;
};""")])
patch(root + '/src/attention/attention.cpp', [
    ("""  if (rows > 0)
    jit::launch(*kernels.prep,""", host_setup('SJIT_TIMELINE', 'kv_grid', WORDS, 'kv_grid > 0') + """  if (rows > 0)
    jit::launch(*kernels.prep,"""),
    ("""    if (atomic) state_->mark_zeroed_scratch_stale(target, stream);  // the adds may have run, unconverted
    throw;
  }
}""", """    if (atomic) state_->mark_zeroed_scratch_stale(target, stream);  // the adds may have run, unconverted
    throw;
  }
""" + host_dump('kv_grid', WORDS, 'key_schedule ? "sparse" : "dense"') + "}"),
    HOST_INCLUDES])
patch(root+'/templates/sparsejit/attention_backward_sm90.cuh', [
("""template <class Cfg>
__global__ void __launch_bounds__(BackwardSm90Layout<Cfg>::threads, 1)""", device_stamps('TL', WORDS) + """template <class Cfg>
__global__ void __launch_bounds__(BackwardSm90Layout<Cfg>::threads, 1)"""),
("""  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);""","""  if (threadIdx.x == 0) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    TL(0, sm);
    TL(1, timeline_now());
  }
  const KeyTileOwner own = key_tile_owner<Cfg>(p, R);"""),
("""  const int count = has_keys ? walk.build(p, own) : 0;  // build() ends with a __syncthreads
""","""  const int count = has_keys ? walk.build(p, own) : 0;  // build() ends with a __syncthreads
  if (threadIdx.x == 0) { TL(2, timeline_now()); TL(9, count); }
"""),
("""        load_row_stats<C, 32>(lse2_ring + slot * C, delta_ring + slot * C, p, own.batch, t.head_q, q0, lane);
        mbarrier_arrive(full);
      }
""","""        load_row_stats<C, 32>(lse2_ring + slot * C, delta_ring + slot * C, p, own.batch, t.head_q, q0, lane);
        mbarrier_arrive(full);
      }
      if (lane == 0) TL(12, timeline_now());
"""),
("""      count_group_done(p.groups_done + own.group);
""","""      count_group_done(p.groups_done + own.group);
      TL(7, timeline_now());
"""),
("""      convert_earlier_group<Cfg>(p, own.group - p.convert_lag, own.rank, own.ranks, threadIdx.x % 64, smem, base);
    }""","""      convert_earlier_group<Cfg>(p, own.group - p.convert_lag, own.rank, own.ranks, threadIdx.x % 64, smem, base);
      if (threadIdx.x % 64 == 0) TL(8, timeline_now());
    }"""),
("""  if (has_keys) mbarrier_wait(barrier(L::kv_ready), 0);
""","""  if (has_keys) mbarrier_wait(barrier(L::kv_ready), 0);
  if (threadIdx.x == 0) TL(3, timeline_now());
  long long full_wait = 0, dq_wait = 0;
"""),
("""    mbarrier_wait(barrier(L::slot_full + slot), (j / stages) & 1);  // tile j's Q, dO and statistics
""","""    const long long c0 = clock64();
    mbarrier_wait(barrier(L::slot_full + slot), (j / stages) & 1);  // tile j's Q, dO and statistics
    if (j == 0) { if (threadIdx.x == 0) { TL(4, timeline_now()); TL(13, clock64()); } } else full_wait += clock64() - c0;
"""),
("""    if (i > 0) mbarrier_wait(barrier(L::dq_empty + group), (i - 1) & 1);
""","""    const long long c1 = clock64();
    if (i > 0) mbarrier_wait(barrier(L::dq_empty + group), (i - 1) & 1);
    dq_wait += clock64() - c1;
"""),
("""  named_barrier(L::math_barrier, L::math_threads);  // every math warp is done with the tiles staged over
""","""  if (threadIdx.x == 0) { TL(5, timeline_now()); TL(10, full_wait); TL(11, dq_wait); TL(15, clock64()); }
  if (threadIdx.x == 128) TL(14, timeline_now());
  named_barrier(L::math_barrier, L::math_threads);  // every math warp is done with the tiles staged over
"""),
("""  store_rows<Tr>(dv, 1.f, staging + L::staging_elems, dv_out, p.dv_row_stride, own.key0, p.seq_k, warp_row0);
}""","""  store_rows<Tr>(dv, 1.f, staging + L::staging_elems, dv_out, p.dv_row_stride, own.key0, p.seq_k, warp_row0);
  if (threadIdx.x == 0) TL(6, timeline_now());
}""")])
