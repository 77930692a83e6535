#!/usr/bin/env bash
# scripts/gpu/kernel_sizes.sh on kernels/cuda/crossentropy.cu (sm_90, this build's include list): one line per kernel
# with its registers, spills (none) and machine-code bytes, every kernel of the file named; a missing file gets exit
# status 2 with a message.
set -uo pipefail
script="$(dirname "$0")/../../scripts/gpu/kernel_sizes.sh"
out=$(BUILD_DIR="$1" NVCC="$2" "$script" crossentropy 90 2>&1)
rc=$?
fail=0
echo "$out"
# 2 input types x 2 output types, and the 2 with bf16 logits again with the row in shared memory: 6 kernels.
rows=$(grep -cE '^crossentropy_kernelI[A-Za-z0-9_]+ +[0-9]+ +[0-9]+ +[0-9]+$' <<< "$out")
if [ "$rc" != 0 ] || [ "$rows" != 6 ]; then echo "FAIL: exit $rc, $rows kernel lines (expected 0 and 6)"; fail=1; fi
if grep -E '^crossentropy' <<< "$out" | awk '$2 < 16 || $2 > 255 || $4 < 1024 || $3 > 0 { bad = 1 } END { exit !bad }'; then
  echo "FAIL: registers, spills or bytes out of range"; fail=1
fi
missing=$(BUILD_DIR="$1" NVCC="$2" "$script" no_such_file 90 2>&1)
rc=$?
if [ "$rc" != 2 ] || ! grep -q 'no .*kernels/cuda/no_such_file.cu' <<< "$missing"; then
  echo "FAIL: a missing file: exit $rc, $missing"; fail=1
fi
[ "$fail" = 0 ] && echo "PASS" || echo "FAILED"
exit $fail
