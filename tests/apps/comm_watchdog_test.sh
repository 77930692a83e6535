#!/usr/bin/env bash
# The collective watchdog: under mpirun -np 2 (zero3), rank 1 skips the world's collective #12
# (GPT_TRAIN_FAULT=skip_collective, after which its next collective hangs). Within comm.timeout_s (2 s) plus
# a little, every rank logs its last collectives, the job ends (non-zero, never a hang) and the message names
# collective #12 and what each rank issued there. Then rank 1 stops outside any collective instead.
set -uo pipefail
gpt_train="$1"
source "$(dirname "$0")/lib.sh"
prepare_data 300 "the quick brown fox jumps over the lazy dog" 11
cat > "$work/run.yaml" <<YAML
run: {out_dir: $work/run, threads: 1}
model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: 50, micro_batch_size: 2, global_batch_sequences: 4, eval_interval: 0, eval_batches: 1}
parallel: {strategy: zero3}
comm: {timeout_s: 2}
YAML
start=$(date +%s)
out=$(GPT_TRAIN_FAULT=skip_collective:1:12 timeout 60 mpirun -np 2 --oversubscribe -x GPT_TRAIN_FAULT \
  "$gpt_train" train -c "$work/run.yaml" 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "watchdog" | head -3
check "the job ends with an error (exit $code)" test "$code" -ne 0 -a "$code" -ne 124
check "within seconds (${elapsed}s)" test "$elapsed" -lt 30
for r in 0 1; do
  check "rank $r logs its last collectives" grep -qE \
    "\[rank $r\] \[error\] (a collective has not finished after 2 s|another rank's collective watchdog fired)" <<< "$out"
done
check "the message names the first collective where the ranks disagree" \
  grep -qE "ranks disagree at world collective #12: rank 0 issued [a-z_]+ of [0-9]+ elements.*rank 1 issued" <<< "$out"

# Rank 1 stops outside any collective (GPT_TRAIN_FAULT=hang): rank 0's watchdog fires and alerts rank 1's,
# which reports too, so the diagnosis names the collective rank 1 never issued.
start=$(date +%s)
out=$(GPT_TRAIN_FAULT=hang:1:5 timeout 60 mpirun -np 2 --oversubscribe -x GPT_TRAIN_FAULT \
  "$gpt_train" train -c "$work/run.yaml" 2>&1)
code=$?
elapsed=$(( $(date +%s) - start ))
echo "$out" | grep -E "watchdog" | head -3
check "a rank stuck outside collectives: the job ends (exit $code) in ${elapsed}s" \
  test "$code" -ne 0 -a "$code" -ne 124 -a "$elapsed" -lt 30
check "the stuck rank reports after the alert" grep -q "\[rank 1\] \[error\] another rank's collective watchdog fired" \
  <<< "$out"
check "the message names what rank 1 never issued" grep -qE "rank 1 never issued world collective #[0-9]+" <<< "$out"

[ "$fail" -eq 0 ] && echo "PASS: a skipped collective and a stuck rank each end the job in seconds, diagnosed"
exit $fail
