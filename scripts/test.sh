#!/usr/bin/env bash
# Builds (if needed) and runs the whole test suite: unit tests, golden tests against the
# PyTorch reference, and end-to-end CLI tests.
#   scripts/test.sh [CTEST ARGS]              the release build (build/)
#   scripts/test.sh --sanitize [CTEST ARGS]   the same suite built with AddressSanitizer and
#                                             UndefinedBehaviorSanitizer (build-sanitize/, no CUDA)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"
build=build
if [ "${1:-}" = "--sanitize" ]; then
  shift
  build=build-sanitize
  [ -f $build/build.ninja ] || cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSLUICE_SANITIZE=ON -DSLUICE_CUDA=OFF
  # Any report fails its test: ASan stops at the first error, UBSan does too (compiled with
  # -fno-sanitize-recover), and leaks are reported at exit.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
fi
[ -f $build/build.ninja ] || cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build $build -j"$jobs"
# Tests run two at a time on small machines: OpenMP threads that spin while waiting would steal
# the cores their partners need, so waiting threads sleep instead.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
cd $build
ctest --output-on-failure -j"$jobs" "$@"
