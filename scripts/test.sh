#!/usr/bin/env bash
# Builds (if needed) and runs the tests.
#   scripts/test.sh [CTEST ARGS]              the release build (build/): the whole suite (unit
#                                             tests, golden tests against the PyTorch reference,
#                                             end-to-end CLI and server tests)
#   scripts/test.sh --sanitize [GTEST ARGS]   the unit tests under AddressSanitizer and
#                                             UndefinedBehaviorSanitizer (build-sanitize/, no CUDA)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${JOBS:-$(nproc)}"
# Tests run two at a time on small machines: OpenMP threads that spin while waiting would steal
# the cores their partners need, so waiting threads sleep instead.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

if [ "${1:-}" = "--sanitize" ]; then
  shift
  build=build-sanitize
  # clang at -O1 with line tables only: sanitizer reports with readable stacks, and a build of
  # about 1250 CPU-seconds (GCC at -O1 -g1 took 2075), which CI does without ccache.
  [ -f $build/build.ninja ] || cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DSLUICE_SANITIZE=ON \
    -DSLUICE_CUDA=OFF
  cmake --build $build -j"$jobs" --target sluice_tests
  # Any report fails its test: ASan stops at the first error, UBSan does too (compiled with
  # -fno-sanitize-recover), and leaks are reported at exit.
  export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
  export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
  # The unit tests: sluice_tests but the suites that run the sluice binary (end to end, a
  # process each) and the golden model tests (the PyTorch reference, minutes) — the release
  # suite runs those. Sharded over the cores.
  skip="Cli.*:CliArguments.*:CliBadModel.*:CliBenchKernels.*:CliPlan.*:BatchJob.*:GgufModel.*"
  skip+=":IsaCli.*:OverBudgetJob.*:ModelGolden.*:OffloadAccounting.*:OffloadCli.*:OffloadDiskCli.*"
  skip+=":PerplexityCli.*:PlanCli.*:QuantizedCheckpointErrors.*:ShippedModel.*:TokenizerErrors.*"
  cd $build
  pids=()
  for ((i = 0; i < jobs; ++i)); do
    GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$i ./sluice_tests --gtest_filter="*-$skip" \
      --gtest_brief=1 "$@" >"unit-shard-$i.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for ((i = 0; i < jobs; ++i)); do
    wait "${pids[$i]}" || { status=1; cat "unit-shard-$i.log"; }
  done
  tail -n 3 unit-shard-*.log
  exit $status
fi

build=build
[ -f $build/build.ninja ] || cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build $build -j"$jobs"
cd $build
ctest --output-on-failure -j"$jobs" "$@"
