#!/usr/bin/env bash
# Installs gpt-train's dependencies from Debian/Ubuntu packages, configures and builds Release into build/,
# and prepares the default corpus (English text from the `fortunes` package) into data/fortunes.
# Idempotent: packages already installed are not fetched again; the build is incremental.
# Options (environment): BUILD_DIR (default build), GPT_CUDA (AUTO|ON|OFF, default AUTO), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."

# ocl-icd-opencl-dev: libdnnl-dev's CMake config requires OpenCL, only a Recommends of it (not installed here).
packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libyaml-cpp-dev libspdlog-dev libfmt-dev
          libcli11-dev catch2 libdnnl-dev ocl-icd-opencl-dev fortunes python3-numpy python3-matplotlib)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

build_dir="${BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DGPT_CUDA="${GPT_CUDA:-AUTO}" > /dev/null
cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"

# The default corpus: about 700 KB of English quotations shipped by Debian's `fortunes` package.
if [ ! -f data/fortunes/train.bin ]; then
  fdir=/usr/share/games/fortunes
  inputs=()
  for f in fortunes literature wisdom people science work education humorists miscellaneous platitudes goedel; do
    [ -f "$fdir/$f" ] && inputs+=(--input "$fdir/$f")
  done
  "$build_dir/gpt-train" prepare "${inputs[@]}" --tokenizer char --out data/fortunes
fi
echo "setup: done. Binary: $build_dir/gpt-train: $("$build_dir/gpt-train" --version)"
