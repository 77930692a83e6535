#!/usr/bin/env bash
# The GPU check: one prepared script for a machine with NVIDIA GPUs (a lent H200 session has about 15 minutes;
# this must finish well inside 8). Builds Release with CUDA, runs every GPU test, prints a summary.
#
#   scripts/gpu/check.sh                 # BUILD_DIR=build-gpu, JOBS=$(nproc)
#
# GPU code so far: the NCCL communicator (engine/comm/nccl_communicator.cc), tested by gpt_mpi_tests [nccl]
# with one rank per visible GPU (NCCL allows one rank per GPU, so a 1-GPU machine runs it at -np 1). The CUDA
# backend (issue 5) adds its parity tests and benchmark here.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD_DIR:-build-gpu}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
summary=()
fail=0
step() {  # step NAME COMMAND...: runs it, records PASS/FAIL and the time
  local name=$1 t0=$SECONDS
  shift
  echo "=== $name: $*"
  if "$@"; then summary+=("PASS  $name ($((SECONDS - t0))s)"); else summary+=("FAIL  $name ($((SECONDS - t0))s)"); fail=1; fi
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: not available"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
step "configure (CUDA on)" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPT_CUDA=ON
step "build" cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target gpt-train gpt_mpi_tests
for np in 1 $([ "$gpus" -gt 1 ] && echo "$gpus"); do
  out=$(timeout 300 mpirun -np "$np" --oversubscribe "$BUILD/tests/comm/gpt_mpi_tests" "[nccl]" 2>&1)
  code=$?
  echo "$out" | tail -5
  if grep -q SKIPPED <<< "$out"; then summary+=("SKIP  NCCL collectives at -np $np: $(grep -o 'SKIPPED.*' <<< "$out" | head -1)")
  elif [ "$code" -eq 0 ]; then summary+=("PASS  NCCL collectives at -np $np")
  else summary+=("FAIL  NCCL collectives at -np $np (exit $code)"); fail=1; fi
done

echo
echo "GPU check summary ($gpus GPU(s) visible, ${SECONDS}s):"
printf '  %s\n' "${summary[@]}"
exit $fail
