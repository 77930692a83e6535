#!/usr/bin/env bash
# Builds (incrementally) and runs the whole test suite with CTest. Run scripts/setup.sh once first.
# Tests that need ../shared/data/tinyshakespeare.txt or a GPU skip with a printed reason when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${BUILD_DIR:-build}"
[ -f "$build_dir/CMakeCache.txt" ] || cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-$(nproc)}" "$@"
