#!/usr/bin/env bash
# Runs the whole test suite through CTest. Without a GPU the `gpu`-labelled tests are reported as
# skipped; with one they run. Each test gets its own kernel cache folder.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/tests/sjit_tests ] || ./scripts/setup.sh
export SJIT_CACHE_DIR="${SJIT_CACHE_DIR:-$(mktemp -d)}"
ctest --test-dir build --output-on-failure -j"$(nproc)"
