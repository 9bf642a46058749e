#!/usr/bin/env bash
# GPU device check: on a GPU machine with only this repository, builds sluice for sm_90, runs the
# CUDA tests, the greedy GPU-vs-CPU comparison and a short Mixtral-8x7B-shaped benchmark under a
# 24 GiB GPU budget, and writes a text and a JSON report into REPORT_DIR (default
# ./device-report/). Designed to finish within 8 minutes on an H200 machine with 16 cores.
# On a machine without a GPU it says so in the report and exits with status 2.
#
# DEVICE_CHECK_STANDIN=1 rehearses the script's own logic without a GPU: it uses the existing
# ./build, skips the CUDA tests and the profile, runs steps 4 and 6 on the CPU stand-in device
# (--device standin) and benchmarks the tiny preset instead of Mixtral-8x7B.
#
# A carried .device-bundle/ (scripts/device-bundle.sh) replaces the build: the lent GPU machines'
# image lacks the Debian libraries sluice links and has no network to install them, so the
# binaries are built for sm_90 on a machine that has them and carried with their libraries. The
# bundle must come from these very sources (scripts/source-tree-id.sh), committed or not.
#
# REPORT_DIR ends up holding four files at most (report.txt, report.json, bench.json and
# logs.tar.gz with every log), so that a tool returning only a few files returns all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
report_dir="${1:-./device-report}"
mkdir -p "$report_dir"
text="$report_dir/report.txt"
json="$report_dir/report.json"
log_dir="$report_dir/logs"
rm -rf "$log_dir" "$report_dir/logs.tar.gz"
mkdir -p "$log_dir"
# Models made here stay out of the report directory (they are large and many files).
scratch=$(mktemp -d "${TMPDIR:-/tmp}/sluice-device-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
: >"$text"
started=$(date +%s)

say() { echo "$*" | tee -a "$text"; }
# Each step: name, status (pass/fail/skipped), detail. Collected for the JSON report.
steps_json=""
record() {
  local name="$1" status="$2" detail="$3"
  say "[$status] $name: $detail"
  local esc=${detail//\\/\\\\}
  esc=${esc//\"/\\\"}
  steps_json+="${steps_json:+,}{\"name\":\"$name\",\"status\":\"$status\",\"detail\":\"$esc\"}"
}
finish() {
  local gpu="$1" verdict="$2"
  local seconds=$(( $(date +%s) - started ))
  printf '{"gpu":%s,"gpu_name":"%s","verdict":"%s","seconds":%d,"steps":[%s]}\n' \
    "$gpu" "${gpu_name:-}" "$verdict" "$seconds" "$steps_json" >"$json"
  say "verdict: $verdict (${seconds}s); report in $report_dir, the logs named above in logs.tar.gz"
  tar -C "$report_dir" -czf "$report_dir/logs.tar.gz" logs && rm -rf "$log_dir"
}

say "sluice device check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

# 1. Is there a GPU? nvidia-smi when the driver is installed; the device nodes otherwise.
gpu_name=""
rehearsal="${DEVICE_CHECK_STANDIN:-}"
bundle=.device-bundle
sluice=./build/sluice sluice_tests=./build/sluice_tests
device=cuda
[ -n "$rehearsal" ] && device=standin gpu_name="none (rehearsal on the CPU stand-in)"
if [ -z "$rehearsal" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_name=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -1)
fi
if [ -z "$gpu_name" ]; then
  record gpu skipped "no NVIDIA GPU found (nvidia-smi absent or lists no GPU): nothing to check here"
  finish false "no-gpu"
  exit 2
fi
record gpu pass "$gpu_name"

# 2. Build for sm_90 with the CUDA backend forced on.
nvcc_path=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
prebuilt=""
[ -z "$rehearsal" ] && [ -f "$bundle/bundle.tar.xz" ] && prebuilt=1
if [ -z "$nvcc_path" ] && [ -z "$rehearsal$prebuilt" ]; then
  record build fail "nvcc not found (PATH or /usr/local/cuda/bin)"
  finish true "fail"
  exit 1
fi
if [ -z "$rehearsal$prebuilt" ] &&
   { ! command -v cmake >/dev/null 2>&1 || ! command -v ninja >/dev/null 2>&1; }; then
  JOBS=$(nproc) scripts/setup.sh >"$log_dir/setup.log" 2>&1 || true
fi
if [ -n "$rehearsal" ]; then
  record build skipped "rehearsal: using the existing ./build"
elif [ -n "$prebuilt" ]; then
  # The bundle's libraries first, then the machine's CUDA; its libstdc++ only if the machine's
  # is older than the one the binaries were built against.
  # The device tool's copy carries the working tree with the .git of an older commit, so the
  # sources are compared, not HEAD.
  sources=$(scripts/source-tree-id.sh 2>/dev/null || echo unknown)
  bundle_sources=$(cat "$bundle/SOURCES" 2>/dev/null || echo unknown)
  bundle_commit=$(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)
  why=""
  if [ "$bundle_sources" != "$sources" ]; then
    why="$bundle/ was built from other sources (tree $bundle_sources, commit $bundle_commit) than these (tree $sources): run scripts/device-bundle.sh again"
  elif ! tar -C "$scratch" -xJf "$bundle/bundle.tar.xz" 2>"$log_dir/prebuilt.err"; then
    why="cannot unpack $bundle/bundle.tar.xz: $(head -c 300 "$log_dir/prebuilt.err")"
  else
    export LD_LIBRARY_PATH="$scratch/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    sluice="$scratch/bin/sluice" sluice_tests="$scratch/bin/sluice_tests"
    # CUDA's libraries elsewhere than /usr/local/cuda (e.g. Python wheels): where they are found.
    for lib in $(ldd "$sluice" 2>/dev/null | awk '/not found/ {print $1}'); do
      found=$(find /usr/local /opt /usr/lib -name "$lib" 2>/dev/null | head -1)
      [ -n "$found" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
    done
    if ! "$sluice" --help >/dev/null 2>"$log_dir/prebuilt.err"; then
      export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$scratch/lib-fallback"
      grep -q GLIBCXX "$log_dir/prebuilt.err" &&
        export LD_LIBRARY_PATH="$scratch/lib-fallback:$LD_LIBRARY_PATH"
      "$sluice" --help >/dev/null 2>"$log_dir/prebuilt.err" ||
        why="the carried binaries do not start: $(head -c 300 "$log_dir/prebuilt.err" | tr '\n' ' ') (LD_LIBRARY_PATH=$LD_LIBRARY_PATH)"
    fi
  fi
  if [ -n "$why" ]; then
    record build fail "$why"
    finish true "fail"
    exit 1
  fi
  export SLUICE_BINARY="$sluice"  # the CLI tests' binary (built elsewhere, another path)
  record build skipped "carried $bundle/ (sources ${sources:0:12}, built at commit ${bundle_commit:0:12}) instead of a build"
elif cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON \
     -DCMAKE_CUDA_COMPILER="$nvcc_path" -DCMAKE_CUDA_ARCHITECTURES=90 >"$log_dir/cmake.log" 2>&1 &&
   timeout 300 cmake --build build -j"$(nproc)" >"$log_dir/build.log" 2>&1; then
  record build pass "sm_90 build in $(( $(date +%s) - started ))s"
else
  # The first CMake error (a missing package, usually) or the build's last line.
  why=$(grep -m1 -A2 'CMake Error' "$log_dir/cmake.log" 2>/dev/null | tr '\n' ' ')
  [ -z "$why" ] && why=$(tail -1 "$log_dir/build.log" 2>/dev/null)
  record build fail "see $log_dir/cmake.log and $log_dir/build.log: $why"
  finish true "fail"
  exit 1
fi

# 3. CUDA tests (the parameterised GPU-vs-CPU engine tests are named TinyModels/CudaOffloadEngine.*)
# and the pipeline's scheduling tests.
if [ -n "$rehearsal" ]; then
  record cuda-tests skipped "rehearsal"
elif timeout 120 "$sluice_tests" \
     --gtest_filter='Cuda*:*/CudaOffloadEngine.*:*/CudaQuantizedEngine.*:*/CudaOffloadDisk.*:CublasLt*:GpuProfiler*:OffloadPipeline*:OffloadAccounting*' \
     >"$log_dir/cuda_tests.log" 2>&1; tests_rc=$?; [ "$tests_rc" -eq 0 ]; then
  # gtest's summary line "[  SKIPPED ] N tests, listed below:" (each skipped test is also
  # printed twice, as it runs and in the list).
  skipped=$(grep -oE '^\[  SKIPPED \] [0-9]+ tests?,' "$log_dir/cuda_tests.log" | grep -oE '[0-9]+')
  passed=$(grep -oE '\[  PASSED  \] [0-9]+' "$log_dir/cuda_tests.log" | grep -oE '[0-9]+$')
  if [ "${skipped:-0}" -gt 0 ]; then
    record cuda-tests fail "$passed passed but $skipped skipped although a GPU is present"
  else
    record cuda-tests pass "$passed tests passed"
  fi
else
  # Failed tests by name; after a crash or the timeout (status 124) there are none: the test that
  # was running is the last one started.
  record cuda-tests fail "exit status $tests_rc; $(grep -E '^\[  FAILED  \]' "$log_dir/cuda_tests.log" | head -5 | tr '\n' ' ') last started: $(grep -E '^\[ RUN      \]' "$log_dir/cuda_tests.log" | tail -1) (see $log_dir/cuda_tests.log)"
fi

# Time budget of the whole check (480 s): build <= 300 s (timeout; ~150 s expected on 16 cores),
# CUDA tests <= 120 s (~30 s expected), greedy check ~30 s, profile <= 60 s, report 25 s; the
# benchmark gets what is left (its layer count is sized from that, below).

# 4. Greedy outputs on the GPU against the CPU path, on a tiny Mixtral made here: every prompt of
# prompts.txt continued 16 tokens at temperature 0. In f32 the texts must be identical; in bf16
# the agreement is reported (the GPU's GEMMs sum in another order, and bf16 rounding of a
# different last bit can flip a near-tie). Three device settings: the pages streamed with the
# default slots; 3 slots with experts of one token on the CPU (the CPU-expert path); and half the
# sequences' attention on the GPU over its KV pool, one layer's experts resident and the lm_head
# on the device.
tiny="$scratch/tiny-mixtral"
printf '%s\n' "The river" "Once upon a time" "0 1 2 3 4 5" "sluice gates open at dawn" \
  "a" "The quick brown fox jumps over the lazy dog and" >"$log_dir/prompts.txt"
greedy_fail="" greedy_detail=""
if ! timeout 60 "$sluice" make-model --preset tiny-mixtral --out "$tiny" --seed 11 \
     >"$log_dir/tiny_make.log" 2>&1; then
  greedy_fail="make-model failed (see $log_dir/tiny_make.log)"
else
  gen() {  # gen NAME PRECISION DEVICE-ARGS...
    local name="$1" precision="$2"
    shift 2
    timeout 60 "$sluice" generate --model "$tiny" --input "$log_dir/prompts.txt" \
      --max-new-tokens 16 --temperature 0 --precision "$precision" "$@" \
      >"$log_dir/greedy_$name.txt" 2>"$log_dir/greedy_$name.err"
  }
  for precision in f32 bf16; do
    if ! gen "cpu_$precision" "$precision" --device cpu; then
      greedy_fail+="cpu $precision run failed; "
      continue
    fi
    for setting in default slots3 gpu_share; do
      args=(--device "$device" --gpu-mem 2GiB)
      [ "$setting" = slots3 ] && args+=(--page-slots 3 --cpu-expert-max-tokens 1)
      [ "$setting" = gpu_share ] &&
        args+=(--cpu-attention-share 0.5 --resident-expert-layers 1 --lm-head device)
      name="${device}_${precision}_$setting"
      if ! gen "$name" "$precision" "${args[@]}"; then
        greedy_fail+="$name failed ($(tail -1 "$log_dir/greedy_$name.err")); "
        continue
      fi
      total=$(wc -l <"$log_dir/greedy_cpu_$precision.txt")
      same=$(paste -d '\n' "$log_dir/greedy_cpu_$precision.txt" "$log_dir/greedy_$name.txt" |
               awk 'NR % 2 == 1 { a = $0; next } { n += (a == $0) } END { print n + 0 }')
      greedy_detail+="$name: $same/$total prompts identical; "
      if [ "$precision" = f32 ] && [ "$same" != "$total" ]; then
        greedy_fail+="$name differs from the CPU in f32 (diff $log_dir/greedy_cpu_f32.txt $log_dir/greedy_$name.txt; a near-tie flip is possible in principle: CudaOffloadEngine.MatchesTheCpuEngine in cuda_tests.log tells flips at near-ties from real differences); "
      fi
    done
  done
fi
if [ -z "$greedy_fail" ]; then
  record greedy-vs-cpu pass "$greedy_detail"
else
  record greedy-vs-cpu fail "$greedy_fail $greedy_detail"
fi

# 5. The machine's GPU profile (pinned H2D bandwidth: the bound below uses it when present).
# `profile --refresh` measures the CPU side too; it is given 60 s and skipped past that, and
# bench then measures the pinned bandwidth itself (3 x 256 MiB copies, < 1 s).
if [ -n "$rehearsal" ]; then
  record profile skipped "rehearsal"
elif timeout 60 "$sluice" profile --refresh >"$log_dir/profile.txt" 2>"$log_dir/profile.err"; then
  if grep -qE '^GPU +none' "$log_dir/profile.txt"; then
    record profile fail "the profile found no usable GPU (see $log_dir/profile.txt)"
  else
    record profile pass "$(grep -E '^GPU' "$log_dir/profile.txt" | head -1)"
  fi
else
  record profile skipped "profile --refresh did not finish in 60 s or failed (see $log_dir/profile.err); bench measures the link itself"
fi
grep -E '^GPU' "$log_dir/profile.txt" 2>/dev/null | tee -a "$text"

# 6. The benchmark: Mixtral-8x7B-shaped, made in memory, --gpu-mem 24GiB, prompt 512, gen 256.
#
# Time arithmetic (H200: PCIe 5 x16, ~50 GB/s pinned H2D; 16 cores; 8 minutes in all):
#   per layer, the experts are 8 x 3 matrices of 14336 x 4096 bf16 = 2.62 GiB = 2.82 GB, so a
#   step streams 56 ms of weights per layer (every expert is hit at B = 256, top-2 of 8);
#   steps: 256 decode steps + prefill 256 x 512 tokens in chunks of 4096 = 32 steps -> ~290
#   steps x 56 ms = 16 s per layer of streaming;
#   prefill attention on the CPU: 256 prompts x 4·512²/2·4096 FLOP = 0.55 TFLOP per layer at
#   ~0.3 TFLOP/s on 16 cores = ~2 s per layer; decode attention (0.67 GB of KV per step per
#   layer at B = 256, ~70 GB/s) overlaps the streaming;
#   making a layer in memory (random init of 2.9 GB): ~4 s on 16 cores (measured:
#   `bench --preset mixtral-8x7b --layers 1` made its 3.2 GiB in 27 s on 2 busy cores, ~23 s of
#   it the layer; random init is per-element compute, parallel over cores: /8 with margin);
#   fixed: ceilings measurement ~3 s, lm_head + sampling on the CPU ~30 ms x 290 steps = ~9 s,
#   page-locking the weights (~1 s per 10 GB), the H2D probe < 1 s: ~20 s.
#   => ~(19 s + make) per layer x 1.5 safety, plus 20 s; L is what the time left allows.
# Host memory: 2.95 GB of weights per layer plus KV 256 x 768 tokens x 4 KiB per layer
#   (0.75 GiB per layer), with 16 GiB kept for the OS and buffers; at most 32 layers.
# The decode bound fraction is per step and so does not depend on L, except that the CPU's
# per-step work (lm_head, sampling) weighs more in a step of few layers: with fewer layers the
# fraction understates the 32-layer one.
elapsed=$(( $(date +%s) - started ))
left=$(( 480 - elapsed - 25 ))  # 25 s for the report and margin
make_per_layer=4
per_layer=$(( (19 + make_per_layer) * 3 / 2 ))
layers_time=$(( (left - 20) / per_layer ))
# The lent H200 machines are microVMs whose memory starts small and grows as it is used (their
# MemTotal and MemAvailable read far below the 128 GiB they have), so there the kind's 128 GiB is
# taken; DEVICE_CHECK_HOST_GIB overrides, other machines use MemAvailable.
host_gib=$(awk '/MemAvailable/ {print int($2 / 1048576)}' /proc/meminfo)
if [ -n "${DEVICE_CHECK_HOST_GIB:-}" ]; then
  host_gib=$DEVICE_CHECK_HOST_GIB
elif [[ "$gpu_name" == *H200* ]] && [ "$host_gib" -lt 128 ]; then
  host_gib=128
fi
layers_mem=$(( (host_gib - 16) * 100 / 349 ))  # 2.74 GiB weights + 0.75 GiB KV per layer
layers=$layers_time
[ "$layers_mem" -lt "$layers" ] && layers=$layers_mem
[ "$layers" -gt 32 ] && layers=32
if [ "$layers" -lt 1 ]; then
  record bench skipped "${left}s left after the earlier steps: not enough for one layer (~${per_layer}s)"
else
  bench_limit=$(( left > 60 ? left : 60 ))
  say "bench: $layers layers (time allows $layers_time, host memory $layers_mem), ${bench_limit}s limit"
  # The host memory given explicitly: bench's default (weights + half of MemAvailable) would
  # read the microVM's small starting figure.
  bench_args=(--preset mixtral-8x7b --layers "$layers" --prompt-len 512 --gen-len 256
              --requests 256 --batch 256 --prefill-chunk 4096 --host-mem "$((host_gib - 12))GiB")
  [ -n "$rehearsal" ] && bench_args=(--preset tiny-mixtral --prompt-len 16 --gen-len 8
                                     --requests 8 --batch 8 --prefill-chunk 32)
  if timeout "$bench_limit" "$sluice" bench "${bench_args[@]}" --device "$device" \
       --gpu-mem 24GiB --ignore-eos --json >"$log_dir/bench.json" 2>"$log_dir/bench.err"; then
    cp "$log_dir/bench.json" "$report_dir/bench.json"
    # Fields of bench's one-line JSON (nlohmann's compact dump: "key":value), without python.
    jget() { grep -oE "\"$1\":[^,}]*" "$log_dir/bench.json" | head -1 | cut -d: -f2- | tr -d '"'; }
    gb() { awk -v v="$(jget "$1")" 'BEGIN { printf "%.1f", v / 1e9 }'; }
    num() { awk -v v="$(jget "$1")" 'BEGIN { printf "%.1f", v }'; }
    pct() { awk -v v="$(jget "$1")" 'BEGIN { printf "%.0f%%", 100 * v }'; }
    figures="decode $(num decode_only_tokens_per_s) tok/s vs bound $(num decode_bound_tokens_per_s) tok/s = $(pct decode_bound_fraction) (B $(num decode_tokens_per_step) per decode step, $(gb decode_weight_bytes_per_step) GB of experts per step); PCIe H2D $(gb pcie_h2d_bytes_per_s) GB/s = $(pct pcie_h2d_fraction) of the $(jget pcie_h2d_reference_source) $(gb pcie_h2d_reference_bytes_per_s) GB/s; GPU busy $(pct gpu_busy_fraction), link busy $(pct link_busy_fraction); $(gb device_pinned_weight_bytes) GB pinned; made in $(num load_seconds) s, ran $(num wall_seconds) s"
    say "PCIe host→device $(gb pcie_h2d_bytes_per_s) GB/s = $(pct pcie_h2d_fraction) of the profiled pinned H2D bandwidth ($(jget pcie_h2d_reference_source) $(gb pcie_h2d_reference_bytes_per_s) GB/s)"
    say "GPU busy $(pct gpu_busy_fraction) of the run"
    record bench pass "${bench_args[*]} --gpu-mem 24GiB: $figures"
    if awk -v f="$(jget decode_bound_fraction)" 'BEGIN { exit !(f + 0 >= 0.70) }'; then
      record decode-bound pass "decode reached >= 70% of the PCIe bound"
    else
      record decode-bound fail "decode below 70% of the PCIe bound (or no figures: see $report_dir/bench.json)"
    fi
  else
    record bench fail "exit or timeout after ${bench_limit}s; see $log_dir/bench.err: $(tail -2 "$log_dir/bench.err" | tr '\n' ' ')"
  fi
fi

if grep -q '"status":"fail"' <<<"$steps_json"; then
  finish true "fail"
  exit 1
fi
finish true "pass"
