#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: unit tests, golden tests against the
# PyTorch reference, and end-to-end CLI tests.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"
[ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
# Tests run two at a time on small machines: OpenMP threads that spin while waiting would steal
# the cores their partners need, so waiting threads sleep instead.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
cd build
ctest --output-on-failure -j"$jobs" "$@"
