# shellcheck shell=bash disable=SC2154  # (lines and ways: the sourcing script's)
# Sourced by device-*.sh scripts that time the backward with its choices forced: bench_forced runs
# `sjit bench attention --queued --backward --iters 10` for each entry of `lines` ("ENV=VALUE ...|bench
# flags": environment for that line, then its flags) under each entry of `ways` (more environment,
# e.g. "SJIT_BACKWARD_WALK=tiles SJIT_BACKWARD_DQ=atomic"), ROUNDS times (default 2), and prints a
# line per pattern row: the round, the line, the way, the density, the backward's ms and how dQ was
# summed. ONLY=REGEX keeps the lines it matches. Needs build-gpu (scripts/device-build.sh).
bench_forced() {
  local round line line_env flags way short
  for round in $(seq "${ROUNDS:-2}"); do
    for line in "${lines[@]}"; do
      [[ -n "${ONLY:-}" && ! "$line" =~ $ONLY ]] && continue
      IFS='|' read -r line_env flags <<<"$line"
      short=$(sed -E 's/--batch [0-9]+ --heads [0-9]+ --seq [0-9]+ //' <<<"$flags")  # (the shape's d stays)
      for way in "${ways[@]}"; do
        # shellcheck disable=SC2086
        env $line_env $way timeout 60 ./build-gpu/sjit bench attention --queued --backward --iters 10 $flags 2>&1 |
          grep -E "^bsr" | awk -F'  +' -v w="round $round | $line_env $short | $way" \
            '{print w, "| density", $2, "| bwd", $10, $11}'
      done
    done
  done
}
