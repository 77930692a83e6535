#!/usr/bin/env bash
# A failure on one rank ends every rank, with the failing rank and its reason logged, never a hang:
# under mpirun -np 2, rank 1 gets a config with an unknown key while rank 0's config is valid (rank 0
# would otherwise wait forever in its first collective).
set -uo pipefail
gpt_train="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 300); do echo "the quick brown fox jumps over the lazy dog $i"; done > "$work/corpus.txt"
"$gpt_train" prepare --input "$work/corpus.txt" --out "$work/data" > /dev/null 2>&1 || exit 1
cat > "$work/good.yaml" <<YAML
run: {out_dir: $work/run, threads: 1}
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: 100000, micro_batch_size: 2, global_batch_sequences: 4, eval_batches: 1, parallel_typo: 1}
parallel: {strategy: zero3}
YAML
sed 's/, parallel_typo: 1//' "$work/good.yaml" > "$work/good_rank0.yaml"
start=$(date +%s)
out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 60 \
  mpirun -np 2 --oversubscribe sh -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$0" train --config "$1"; else exec "$0" train --config "$2"; fi' \
  "$gpt_train" "$work/good.yaml" "$work/good_rank0.yaml" 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "rank 1|MPI_ABORT" | head -5
fail=0
[ "$code" -ne 0 ] || { echo "FAIL: exit code 0"; fail=1; }
[ "$code" -ne 124 ] || { echo "FAIL: hung until the timeout"; fail=1; }
# A here-string, not a pipe: under pipefail, grep -q quitting at the first match can kill echo with SIGPIPE and
# fail the check although the line is there.
grep -q "\[rank 1\] \[error\].*unknown key 'training.parallel_typo'" <<< "$out" || { echo "FAIL: rank 1's error not logged"; fail=1; }
[ "$elapsed" -lt 30 ] || { echo "FAIL: took ${elapsed}s"; fail=1; }

# The other subcommands under mpirun with 3 tasks (srun in an sbatch script does this): rank 0 alone does the work.
# Before, every rank prepared the same files and raced on their temporaries (a rename failed on one), and sample
# printed its text 3 times.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
out=$(timeout 60 mpirun -np 3 --oversubscribe "$gpt_train" prepare --input "$work/corpus.txt" --out "$work/data3" 2>&1)
code=$?
if [ "$code" -ne 0 ] || ! cmp -s "$work/data/train.bin" "$work/data3/train.bin"; then
  echo "FAIL: prepare under mpirun -np 3 (exit $code)"; echo "$out" | tail -5; fail=1
fi
grep -q "prepare runs on rank 0 only; the job's other 2 rank(s) have nothing to do" <<< "$out" ||
  { echo "FAIL: prepare does not say it runs on rank 0 only"; fail=1; }
sed 's/, parallel_typo: 1//; s/steps: 100000/steps: 2/; s/strategy: zero3/strategy: ddp/' "$work/good.yaml" > "$work/short.yaml"
# Run alone (no launcher's variables), only train starts MPI: the other subcommands work where MPI cannot start, and
# skip its singleton start (about 0.3 s). A transport that does not exist makes MPI's start fail.
if ! env -u OMPI_COMM_WORLD_SIZE -u PMIX_RANK OMPI_MCA_pml=no_such_pml "$gpt_train" plan -c "$work/short.yaml" -n 2 \
    > /dev/null 2>&1; then
  echo "FAIL: plan run alone started MPI (it failed with MPI's transport broken)"; fail=1
fi
if env OMPI_MCA_pml=no_such_pml timeout 60 "$gpt_train" train --config "$work/short.yaml" > /dev/null 2>&1; then
  echo "FAIL: train with MPI's transport broken did not fail (does it still start MPI?)"; fail=1
fi
timeout 60 mpirun -np 2 --oversubscribe "$gpt_train" train --config "$work/short.yaml" > /dev/null 2>&1 ||
  { echo "FAIL: the 2-step run under mpirun -np 2"; fail=1; }
# A --set given to one task only: the ranks' configs differ. comm.timeout_s 0 there (no watchdog) once left that rank
# in the comparison while the others made the watchdog's communicator: a hang. Every rank fails at once, naming it.
start=$(date +%s)
out=$(timeout 60 mpirun -np 2 --oversubscribe sh -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$0" train -c "$1" --set comm.timeout_s=0; else exec "$0" train -c "$1"; fi' \
  "$gpt_train" "$work/short.yaml" 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
if [ "$code" -ne 2 ] || [ "$elapsed" -ge 30 ] ||
   ! grep -q "rank 1's config differs from rank 0's at comm.timeout_s: 0 here, 300 on rank 0" <<< "$out"; then
  echo "FAIL: configs that differ in comm.timeout_s (exit $code after ${elapsed}s)"; echo "$out" | tail -5; fail=1
fi
samples=$(timeout 60 mpirun -np 3 --oversubscribe "$gpt_train" sample --run "$work/run" --prompt-ids 1 --ids -n 5 2>/dev/null |
  grep -cE '^1( [0-9]+){5}$')
[ "$samples" = 1 ] || { echo "FAIL: sample under mpirun -np 3 printed $samples samples, not 1"; fail=1; }
[ "$fail" -eq 0 ] && echo "PASS: every rank ended in ${elapsed}s with rank 1's error logged; prepare and sample run on rank 0 alone under mpirun; run alone, only train starts MPI"
exit $fail
