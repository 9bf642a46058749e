#!/usr/bin/env bash
# Installs sluice's dependencies from Debian packages (only those missing) and builds it.
# Safe to run again: it installs nothing twice and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev libopenblas-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libpcre2-dev libcpp-httplib-dev liburing-dev libsentencepiece-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch
  python3-dev pybind11-dev  # the Python module `sluice` (build/python)
  python3-pytest            # its tests
  python3-jinja2            # the chat templates are checked against Jinja2
  wamerican  # /usr/share/dict/words: the shipped model's test checks its words against it
  librsvg2-bin  # rsvg-convert: `sluice plan --svg` also writes a PNG
  nodejs  # the official OpenAI SDK's test of `sluice serve` (tests/server/openai_client.mjs)
  clang libclang-rt-dev  # scripts/fuzz.sh: clang and its libFuzzer runtime (libclang_rt.fuzzer)
)
# npm too, unless a nodejs from elsewhere (NodeSource) brings its own, which Debian's would clash with.
command -v npm >/dev/null || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

jobs="${JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
echo "setup: built ./build/sluice"

# The official OpenAI SDK, pinned, into tests/server/node_modules (gitignored) for the server's
# client test; without npm or its registry the test is skipped, and setup still succeeds.
openai_sdk=openai@5.23.2
if [ -f tests/server/node_modules/openai/package.json ] &&
  grep -q "\"version\": \"${openai_sdk#openai@}\"" tests/server/node_modules/openai/package.json; then
  :
elif command -v npm >/dev/null &&
  timeout 300 npm install --prefix tests/server --no-save --no-audit --no-fund --silent \
    "$openai_sdk"; then
  echo "setup: installed the npm package $openai_sdk for the server's client test"
else
  echo "setup: could not install the npm package $openai_sdk (no npm, or its registry is" \
    "unreachable); the OpenAI SDK test of sluice serve will be skipped"
fi
