#!/usr/bin/env bash
# A stop signal mid-run (what Slurm sends before the time limit or on preemption) ends the job cleanly, and
# the requeued job continues exactly: under mpirun -np 2 (zero2), SIGUSR1 to ONE rank makes both ranks finish
# the same step, write a checkpoint and exit 0; --resume auto then finishes the run with the same final loss
# as an uninterrupted run, and metrics.jsonl has every step exactly once.
set -uo pipefail
gpt_train="$1"
source "$(dirname "$0")/lib.sh"
steps=1500
prepare_data 600 "all the world's a stage, and all the men and women merely players" 17
cat > "$work/run.yaml" <<YAML
run: {out_dir: $work/run, threads: 1, seed: 11}
model: {n_layer: 2, n_head: 2, n_embd: 48, block_size: 32, dropout: 0.1}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: $steps, micro_batch_size: 4, global_batch_sequences: 8, eval_interval: 0, eval_batches: 1,
           warmup_steps: 10}
parallel: {strategy: zero2}
logging: {log_interval: 100}
YAML
mpi() { timeout 120 mpirun -np 2 --oversubscribe "$@"; }
last_loss() { grep -o "\"step\":$steps,\"loss\":[0-9.]*" "$1/metrics.jsonl"; }

mpi "$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/ref" > "$work/ref.log" 2>&1 ||
  { tail "$work/ref.log"; exit 1; }
ref=$(last_loss "$work/ref")

mpirun -np 2 --oversubscribe "$gpt_train" train -c "$work/run.yaml" > "$work/first.log" 2>&1 &
launcher=$!
for _ in $(seq 200); do  # until the run is well under way
  [ -f "$work/run/metrics.jsonl" ] && [ "$(wc -l < "$work/run/metrics.jsonl")" -ge 50 ] && break
  sleep 0.1
done
rank=$(pgrep -P "$launcher" -f "gpt-train train" | head -1)
check "found a rank's pid" test -n "$rank"
kill -USR1 "$rank"
wait "$launcher"
code=$?
check "the job exits 0 after the signal (got $code)" test "$code" -eq 0
[ "$code" -eq 0 ] || { echo "--- the signalled job's log (tail):"; tail -n 40 "$work/first.log"; }
check "rank 0 logs the stop" grep -qE "(SIGUSR1 received|another rank was signalled): checkpoint saved after signal" \
  "$work/first.log"
stopped=$(grep -o "saved after signal at step [0-9]*" "$work/first.log" | head -1 | awk '{print $NF}')
check "it stopped mid-run (step ${stopped:-none} of $steps)" test -n "$stopped" -a "${stopped:-0}" -lt "$steps"
check "latest names that step" test "$(cat "$work/run/checkpoints/latest")" = "$(printf 'step_%08d' "${stopped:-0}")"
check "no final model was written for the unfinished run" test ! -e "$work/run/model"
check "summary.json says interrupted at that step" grep -qz "\"steps_done\": $stopped,.*\"interrupted\": true" \
  "$work/run/summary.json"

mpi "$gpt_train" train -c "$work/run.yaml" --resume auto > "$work/second.log" 2>&1
check "the requeued job finishes (exit $?)" grep -q "done: $steps steps" "$work/second.log"
check "final loss equals the uninterrupted run's ($ref)" test "$(last_loss "$work/run")" = "$ref"
check "summary.json says finished" grep -qz "\"steps_done\": $steps,.*\"interrupted\": false" "$work/run/summary.json"
check "metrics.jsonl has each of the $steps steps once" \
  test "$(grep -o '"step":[0-9]*' "$work/run/metrics.jsonl" | sort -u | wc -l)" -eq "$steps" -a \
  "$(wc -l < "$work/run/metrics.jsonl")" -eq "$steps"

[ "$fail" -eq 0 ] && echo "PASS: a signal checkpoints and exits 0, and the resumed run ends where an uninterrupted one does"
exit $fail
