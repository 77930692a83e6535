#!/usr/bin/env bash
# Registers, spills and machine-code bytes of each kernel in kernels/cuda/FILE.cu, as ptxas builds them for one
# target, without a GPU: what a session without one can measure of a kernel change (the size of a kernel's .text
# section stands in for its instruction count, 16 bytes each; this machine has no nvdisasm or cuobjdump). Also
# ptxas's wgmma serialisation warnings (C7512/C7519/C7520), which cost more than any size.
#
#   scripts/gpu/kernel_sizes.sh attention_wgmma 90a            # FILE (no .cu), ARCH (90a for the wgmma files)
#   scripts/gpu/kernel_sizes.sh attention_mma_backward 80
#   BUILD_DIR=build scripts/gpu/kernel_sizes.sh crossentropy   # ARCH 90 by default
#
# One line per kernel: name (mangled, past its namespace), registers, spill stores (bytes), .text bytes. Needs a
# configured CUDA build (BUILD_DIR, default build: its engine/ include list) and readelf.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FILE=${1:?usage: kernel_sizes.sh FILE [ARCH]}
ARCH=${2:-90}
BUILD_DIR=${BUILD_DIR:-build}
[[ $BUILD_DIR == /* ]] || BUILD_DIR=$ROOT/$BUILD_DIR
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
RSP=$BUILD_DIR/engine/CMakeFiles/gpt_engine.dir/includes_CUDA.rsp
SRC=$ROOT/kernels/cuda/$FILE.cu
[[ -f $SRC ]] || { echo "kernel_sizes.sh: no $SRC" >&2; exit 2; }
if [[ ! -f $RSP ]]; then
  echo "kernel_sizes.sh: no $RSP (a CUDA build by CMake's Makefile generator, as scripts/setup.sh configures)" >&2
  exit 2
fi
TMP=$(mktemp -d /tmp/kernel-sizes.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

(cd "$BUILD_DIR/engine" && "$NVCC" --options-file "$RSP" -I"$ROOT/engine" -I"$ROOT" -O3 -std=c++20 \
  --generate-code=arch=compute_$ARCH,code=sm_$ARCH -Xptxas -v -cubin "$SRC" -o "$TMP/k.cubin") 2> "$TMP/ptxas.txt"
grep -E 'C751[0-9]|C752[0-9]' "$TMP/ptxas.txt" | sed 's/^/warning: /' || true
# ptxas -v: per entry, "Compiling entry function 'NAME'", then its spills, then "Used N registers".
awk '/Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2) }
     /bytes spill stores/ { for (i = 1; i <= NF; ++i) if ($i == "spill" && $(i + 1) == "stores,") spill = $(i - 2) }
     /Used [0-9]+ registers/ { for (i = 1; i <= NF; ++i) if ($i == "Used") regs = $(i + 1); print name, regs, spill }' \
  "$TMP/ptxas.txt" > "$TMP/regs.txt"
# .text.NAME sections' sizes (hex), by name.
readelf -SW "$TMP/k.cubin" 2> /dev/null |
  sed -nE 's/.*\] \.text\.([^ ]+) +[A-Z]+ +[0-9a-f]+ +[0-9a-f]+ +([0-9a-f]+) .*/\1 \2/p' > "$TMP/text.txt"
printf '%-70s %5s %6s %7s\n' kernel regs spill bytes
while read -r name regs spill; do
  hex=$(awk -v n="$name" '$1 == n { print $2 }' "$TMP/text.txt")
  # past gpt::cuda and its anonymous namespace, to the end of the template arguments
  short=$(sed -E -e 's/^_ZN3gpt4cuda([0-9]+_GLOBAL__N__[0-9a-f]+_[0-9]+_[a-z_]+_cu_[0-9a-f]{8})?[0-9]+//' \
    -e 's/E?Ev[PRKSNilf].*$//' -e 's/_kernelE[PRKSNilf].*$/_kernel/' <<< "$name" | cut -c1-70)
  printf '%-70s %5s %6s %7d\n' "$short" "$regs" "${spill:-0}" "$((16#${hex:-0}))"
done < "$TMP/regs.txt"
