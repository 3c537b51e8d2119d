#!/usr/bin/env bash
# On the lent GPU machine: runs the GPU test cases under NVIDIA's compute-sanitizer (TOOL: memcheck,
# racecheck, synccheck or initcheck; memcheck by default), PARALLEL at a time, each under a timeout
# of LIMIT seconds and all of them within DEADLINE seconds of the start (tests not begun by then are
# listed as not run), and prints a line a test: its errors, or that it ran out of time (no verdict
# then). ONLY, a regular expression, picks test cases by name. The sanitizer's logs of tests with
# errors stay in $OUT/sanitize, and the lines in $OUT/sanitize/summary.txt as they come. Usage there
# (carrying .deps):
#   TOOL=memcheck PARALLEL=12 LIMIT=420 DEADLINE=480 bash scripts/device-sanitize.sh
# With SJIT_LINEINFO=1 the reports name the templates' lines; PRINT_LIMIT (20) caps the reports a test.
# EXCLUDE, a kernel name's substring, leaves those kernels out of the tool's checks (they still run;
# with initcheck what they store is untracked too, so later kernels' reads of it are reported:
# docs/sanitizers.md, "What is left").
set -uo pipefail
source scripts/device-build.sh
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
mkdir -p "$OUT/sanitize"
export SJIT_CACHE_DIR=$OUT/sanitize-cache
ctest --test-dir build-gpu -L gpu --show-only=json-v1 >"$OUT/sanitize/tests.json"
python3 - "$sanitizer" "${TOOL:-memcheck}" "${PARALLEL:-12}" "${LIMIT:-420}" "${ONLY:-.}" "${DEADLINE:-480}" <<'EOF'
import concurrent.futures, json, os, re, signal, subprocess, sys, threading, time
sanitizer, tool, parallel, limit, only = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
deadline = time.time() + int(sys.argv[6])
lock = threading.Lock()
out = os.path.join(os.environ["OUT"], "sanitize")
tests = [t for t in json.load(open(os.path.join(out, "tests.json")))["tests"] if re.search(only, t["name"])]
extra = {"memcheck": ["--leak-check", "no"], "racecheck": ["--racecheck-report", "hazard"]}.get(tool, [])
if os.environ.get("EXCLUDE"):
    extra += ["--kernel-name-exclude", "kns=" + os.environ["EXCLUDE"]]

def run(index_test):
    index, test = index_test
    cwd = next((p["value"] for p in test.get("properties", []) if p["name"] == "WORKING_DIRECTORY"), None)
    command = [sanitizer, "--tool", tool, "--error-exitcode", "99", "--print-limit", os.environ.get("PRINT_LIMIT", "20"), *extra, *test["command"]]
    start = time.time()
    if deadline - start < 5:
        return test["name"], "not run (deadline)", 0.0
    # A session of its own, so that a timeout kills the test under the sanitizer too.
    child = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        text, _ = child.communicate(timeout=min(limit, deadline - start))
        code = child.returncode
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        text, code = child.communicate()[0], None
    summary = re.findall(r"ERROR SUMMARY: (\d+) error", text)
    if code is None:
        verdict = "ran out of time (no verdict)"
    elif summary and int(summary[-1]) > 0:
        verdict = f"{summary[-1]} errors"
    elif code == 77:
        verdict = "skipped"
    elif code != 0:
        verdict = f"test failed (exit {code})"
    else:
        verdict = "clean"
    if verdict not in ("clean", "skipped"):
        with open(os.path.join(out, f"test-{index:02d}.log"), "w") as log:
            log.write(test["name"] + "\n" + text)
    with lock, open(os.path.join(out, "summary.txt"), "a") as lines:
        lines.write(f"{verdict:32s} {time.time() - start:6.0f} s  {test['name']}\n")
    return test["name"], verdict, time.time() - start

with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
    results = list(pool.map(run, enumerate(tests)))
for name, verdict, seconds in results:
    print(f"{verdict:32s} {seconds:6.0f} s  {name}")
counts = {}
for _, verdict, _ in results:
    key = verdict.split(" (")[0] if "errors" not in verdict else "with errors"
    counts[key] = counts.get(key, 0) + 1
print(f"{tool}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
EOF
# racecheck and the ring slots the sm_90 backward's math warps hand back with one lane a warp: the probe
# of tests/sanitizer/mbarrier_hand_over.cu, run both ways (docs/sanitizers.md).
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [[ ${TOOL:-memcheck} == racecheck ]] &&
  "$nvcc" -arch=sm_90a -o /tmp/sjit-hand-over tests/sanitizer/mbarrier_hand_over.cu; then
  for way in every-lane one-lane; do
    "$sanitizer" --tool racecheck --print-limit 2 /tmp/sjit-hand-over "$way" 2>&1 |
      grep -E "expected|RACECHECK SUMMARY" | tr '\n' ' '
    echo
  done
fi
# initcheck and global memory written by bulk copies from shared memory (the forward's O, the split
# last round's staged outputs): the probe of tests/sanitizer/bulk_store_initcheck.cu, three ways.
if [[ ${TOOL:-memcheck} == initcheck ]] &&
  "$nvcc" -arch=sm_90a -o /tmp/sjit-bulk-store tests/sanitizer/bulk_store_initcheck.cu -lcuda; then
  for way in plain bulk tensor; do
    "$sanitizer" --tool initcheck --print-limit 1 /tmp/sjit-bulk-store "$way" 2>&1 |
      grep -E "expected|ERROR SUMMARY" | tr '\n' ' '
    echo
  done
fi
