#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (build-fuzz/, ASan + UBSan, only the parsers)
# and runs each for its share of SECONDS (default 600), one after another. Each target's corpus
# grows in build-fuzz/corpus/<target>, seeded from fuzz/make_seeds.py; a crash, sanitizer report,
# leak, hang (> 10 s on one input) or more than 2 GiB of memory fails the script, and the input
# is left in build-fuzz/crashes/<target>/ (keep it as a regression test in tests/unit).
#   scripts/fuzz.sh [SECONDS] [TARGET...]     SECONDS shared between the targets
#   scripts/fuzz.sh --each SECONDS [TARGET...]  SECONDS for every target (CI: 20)
set -euo pipefail
cd "$(dirname "$0")/.."
each="" total=600
if [ "${1:-}" = "--each" ]; then
  each="$2"
  shift 2
elif [ $# -gt 0 ]; then
  total="$1"
  shift
fi
build=build-fuzz
[ -f $build/build.ninja ] || cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DSLUICE_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DSLUICE_CUDA=OFF
cmake --build $build -j"${JOBS:-$(nproc)}"
python3 fuzz/make_seeds.py $build/seeds

targets=("$@")
if ((${#targets[@]} == 0)); then
  for f in $build/fuzz/fuzz_*; do targets+=("$(basename "$f")"); done
fi
share="${each:-$((total / ${#targets[@]}))}"
((share > 0)) || share=1
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
summary=()
for target in "${targets[@]}"; do
  name="${target#fuzz_}"
  corpus=$build/corpus/$name
  crashes=$build/crashes/$name
  mkdir -p "$corpus" "$crashes"
  log=$build/logs/$name.log
  mkdir -p "$(dirname "$log")"
  echo "fuzz: $target for ${share}s"
  if OMP_NUM_THREADS=1 "$build/fuzz/$target" -max_total_time="$share" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/" \
      "$corpus" "$build/seeds/$name" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$target")
    grep -E "ERROR|==[0-9]+==|SUMMARY|Test unit written|uncaught|terminate" "$log" | head -20 || true
  fi
  runs=$(grep -oE "stat::number_of_executed_units: *[0-9]+" "$log" | grep -oE "[0-9]+$" || echo 0)
  summary+=("$(printf '%-28s %-7s %10s executions  %s inputs in corpus' "$target" "$status" \
    "$runs" "$(find "$corpus" -type f | wc -l)")")
done
printf '%s\n' "${summary[@]}"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]} (logs in $build/logs, inputs in $build/crashes)"
  exit 1
fi
