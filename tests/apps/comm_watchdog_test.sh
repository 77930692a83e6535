#!/usr/bin/env bash
# The collective watchdog: under mpirun -np 2 (zero3), rank 1 skips the world's collective #15 (counting the start-up
# ones that compare the ranks' configs and check the checkpoint root; GPT_TRAIN_FAULT=skip_collective, after which its
# next collective hangs). Within comm.timeout_s (2 s) plus
# a little, every rank logs its last collectives, the job ends (non-zero, never a hang) and the message names
# collective #15 and what each rank issued there. Then rank 1 stops outside any collective instead; then its whole
# process stops (SIGSTOP: its watchdog too), and the message names it as the rank that did not answer; then it
# stops inside a checkpoint save, which comm.save_timeout_s ends.
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
# run_with_fault FAULT [ARGS...]: a 2-rank training run with GPT_TRAIN_FAULT=FAULT; sets out, code and elapsed (s).
run_with_fault() {
  local fault=$1 start
  shift
  start=$(date +%s)
  out=$(GPT_TRAIN_FAULT=$fault timeout 60 mpirun -np 2 --oversubscribe -x GPT_TRAIN_FAULT \
    "$gpt_train" train -c "$work/run.yaml" "$@" 2>&1)
  code=$?
  elapsed=$(( $(date +%s) - start ))
  echo "$out" | grep -E "watchdog" | head -3
}
run_with_fault skip_collective:1:15
check "the job ends with an error (exit $code)" test "$code" -ne 0 -a "$code" -ne 124
check "within seconds (${elapsed}s)" test "$elapsed" -lt 30
for r in 0 1; do
  check "rank $r logs its last collectives" grep -qE \
    "\[rank $r\] \[error\] (a world collective has not finished after 2 s \(comm.timeout_s\)|another rank's collective watchdog fired)" <<< "$out"
done
check "the message names the first collective where the ranks disagree" \
  grep -qE "ranks disagree at world collective #15: rank 0 issued [a-z_]+ of [0-9]+ elements.*rank 1 issued" <<< "$out"

# Rank 1 stops outside any collective (GPT_TRAIN_FAULT=hang): rank 0's watchdog fires and alerts rank 1's,
# which reports too, so the diagnosis names the collective rank 1 never issued.
run_with_fault hang:1:5
check "a rank stuck outside collectives: the job ends (exit $code) in ${elapsed}s" \
  test "$code" -ne 0 -a "$code" -ne 124 -a "$elapsed" -lt 30
check "the stuck rank reports after the alert" grep -q "\[rank 1\] \[error\] another rank's collective watchdog fired" \
  <<< "$out"
check "the message names what rank 1 never issued" grep -qE "rank 1 never issued world collective #[0-9]+" <<< "$out"

# Rank 1's whole process stops (GPT_TRAIN_FAULT=stop: SIGSTOP, as a frozen node): no watchdog answers for it, so
# rank 0's names it. (Before, the histories went through one all-gather: the message could not say which rank was
# missing, and the abort freed buffers the pending all-gather still wrote into.)
run_with_fault stop:1:5
check "a stopped rank: the job ends (exit $code) in ${elapsed}s" test "$code" -ne 0 -a "$code" -ne 124 -a "$elapsed" -lt 30
check "the message names the rank that did not answer" \
  grep -qE "collective watchdog on rank 0: rank\(s\) 1 did not answer within comm.timeout_s" <<< "$out"
check "and no heap corruption on the rank that aborts" bash -c '! grep -qiE "corrupted|double free|free\(\)" <<< "$1"' _ "$out"

# Rank 1 stops inside the save of step 2 (its file system never returns): the checkpoint writer's collectives are held
# to comm.save_timeout_s (2 s here; before, they were not watched and the job waited for ever).
run_with_fault hang_during_save:1:2 --set checkpoint.every=2 --set comm.save_timeout_s=2
check "a rank stuck in a save: the job ends (exit $code) in ${elapsed}s" \
  test "$code" -ne 0 -a "$code" -ne 124 -a "$elapsed" -lt 30
check "rank 0 reports the save's collective under comm.save_timeout_s" \
  grep -q "\[rank 0\] \[error\] a checkpoint collective has not finished after 2 s (comm.save_timeout_s)" <<< "$out"
check "the message names what rank 1 never issued in the save" \
  grep -qE "rank 1 never issued checkpoint collective #[0-9]+" <<< "$out"

[ "$fail" -eq 0 ] && echo "PASS: a skipped collective, a stuck rank, a stopped rank and a rank stuck in a save each end the job in seconds, diagnosed"
exit $fail
