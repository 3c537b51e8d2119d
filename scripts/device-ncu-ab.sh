#!/usr/bin/env bash
# On the lent GPU machine, after `BENCH= bash scripts/device-ab.sh` has built the trees: each kernel's
# own duration (Nsight Compute, one metric, no replay) for every bench line of NCU_BENCH, tree by tree
# (.snap-a, the working tree, then EXTRA), so that an A/B can say which of a call's kernels moved.
# Raw CSV in $OUT/ncu-TREE-LINE.csv; a summary (kernel, grid, median us over its launches) on stdout.
set -uo pipefail
OUT=${OUT:-/tmp/sjit-out}; mkdir -p "$OUT"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
n=0
while IFS= read -r line; do
  [[ -z $line ]] && continue
  n=$((n + 1))
  for dir in .snap-a . ${EXTRA:-}; do
    name=${dir//[.\/]/}; [[ $dir == . ]] && name=b
    csv="$OUT/ncu-$name-$n.csv"
    # shellcheck disable=SC2086
    timeout 200 "$NCU" --clock-control none --cache-control none -k "regex:${NCU_KERNELS:-attention}" \
      --metrics gpu__time_duration.sum --print-units base --csv "$dir/build-gpu/sjit" bench attention --iters 3 --warmup 1 $line \
      >"$csv" 2>/dev/null
    echo "== $name: $line"
    python3 - "$csv" <<'PY'
import csv, statistics, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit(print("  no kernels profiled"))
h = rows[0]; k, g, v = h.index("Kernel Name"), h.index("Grid Size"), h.index("Metric Value")
times = {}
for r in rows[1:]:
    name = r[k].split("<")[0].split("::")[-1]
    times.setdefault((name, r[g]), []).append(float(r[v].replace(",", "")) / 1000)
# A kernel of one grid serves every density of a bench line: split its launches where consecutive
# sorted times jump by more than 1.5x (dense and sparse runs), and report each cluster.
for (name, grid), t in times.items():
    t.sort()
    clusters = [[t[0]]]
    for x in t[1:]:
        (clusters[-1].append(x) if x < 1.5 * clusters[-1][-1] else clusters.append([x]))
    for c in clusters:
        print(f"  {name:32s} grid {grid:16s} x{len(c):3d}  median {statistics.median(c):9.1f} us  min {c[0]:9.1f}")
PY
  done
done <<<"${NCU_BENCH:-}" | tee "$OUT/ncu.log"
