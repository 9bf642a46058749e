#!/usr/bin/env bash
# Packs this machine's CUDA build of sluice for a GPU machine that cannot build it: the lent
# GPU machines' image has nvcc, CMake and the CUDA libraries but none of the Debian libraries
# sluice links (oneDNN, fmt, spdlog, ICU, PCRE2, sentencepiece), and no network to install them.
#
#   scripts/device-bundle.sh            # builds ./build for sm_90 if needed, writes .device-bundle/
#   then, through the device tool: carry [".device-bundle"], run `scripts/device-check.sh "$OUT"`
#
# .device-bundle/bundle.tar.xz holds bin/sluice, bin/sluice_tests, lib/ (every shared library
# they load except the C runtime and the CUDA libraries, which the GPU machine has), and
# lib-fallback/libstdc++.so.6 (used there only if its own is too old); .device-bundle/SOURCES
# holds the id of the sources it was built from (scripts/source-tree-id.sh: committed or not), and
# device-check.sh refuses a bundle of other sources; .device-bundle/COMMIT names HEAD, for people.
# About 19 MB, under the device tool's 64 MiB carry limit.
set -euo pipefail
cd "$(dirname "$0")/.."
out=.device-bundle

if ! ldd build/sluice 2>/dev/null | grep -q libcudart; then
  echo "device-bundle: building ./build with the CUDA backend for sm_90"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
fi
cmake --build build -j"${JOBS:-$(nproc)}" --target sluice sluice_tests
if ! ldd build/sluice | grep -q libcudart; then
  echo "device-bundle: ./build/sluice has no CUDA backend (configure with -DSLUICE_CUDA=ON)" >&2
  exit 1
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/lib-fallback"
cp build/sluice build/sluice_tests "$stage/bin/"
# The C runtime comes from the GPU machine (a newer glibc runs binaries built against this
# one), and so do the CUDA libraries (the same CUDA 13 there, matching its driver).
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libgcc_s\.|libcuda|libcublas)'
ldd build/sluice build/sluice_tests | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    if [[ "$name" =~ ^libstdc\+\+ ]]; then
      cp -L "$path" "$stage/lib-fallback/$name"
    elif ! [[ "$name" =~ $skip ]]; then
      cp -L "$path" "$stage/lib/$name"
    fi
  done
mkdir -p "$out"
tar -C "$stage" -cJf "$out/bundle.tar.xz.tmp" bin lib lib-fallback
mv "$out/bundle.tar.xz.tmp" "$out/bundle.tar.xz"
git rev-parse HEAD >"$out/COMMIT"
scripts/source-tree-id.sh >"$out/SOURCES"
echo "device-bundle: $out/bundle.tar.xz ($(du -h "$out/bundle.tar.xz" | cut -f1)), commit $(cut -c1-12 "$out/COMMIT"): $(ls "$stage/lib" | tr '\n' ' ')"
