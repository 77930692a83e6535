#!/usr/bin/env bash
# Stop signals in one process (no MPI launcher): SIGTERM to a training run ends it after the current step with a
# checkpoint and exit 0; a command that does not stop gracefully (sample) still ends on SIGTERM at once, with the
# signal's exit status (the stop signals are taken by one waiting thread, which re-raises them until train arms it),
# and a signal the process was started ignoring stays ignored. --stop-marker (what the sbatch templates requeue
# on) is written only by a run that a signal stopped early, and a stale one is removed by a run that finishes; a
# signal during the start-up (before the first step) stops the run after step 1 with a checkpoint too.
set -uo pipefail
gpt_train="$1"
source "$(dirname "$0")/lib.sh"
prepare_data 300 "to be or not to be, that is the question" 13
cat > "$work/run.yaml" <<YAML
run: {out_dir: $work/run, threads: 1, seed: 3}
model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 32, dropout: 0.0}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: 1000000, micro_batch_size: 2, eval_interval: 0, eval_batches: 1, warmup_steps: 1}
logging: {log_interval: 1000}
YAML
# A marker that could not be written is an error at the start, not after the checkpoint it was to announce.
"$gpt_train" train -c "$work/run.yaml" --stop-marker "$work/no/such/dir/stopped" > "$work/bad.log" 2>&1
code=$?
check "a marker in a missing directory: exit non-zero at once (got $code)" test "$code" -ne 0
check "naming the directory" grep -q "stop-marker .*cannot write into '$work/no/such/dir'" "$work/bad.log"
check "before any step" test ! -e "$work/run/metrics.jsonl"

# A run that finishes removes a stale marker and writes none (a signal in its last step must not requeue it).
echo stale > "$work/stopped"
"$gpt_train" train -c "$work/run.yaml" --set training.steps=3 --set run.out_dir="$work/short" \
  --stop-marker "$work/stopped" > "$work/short.log" 2>&1
code=$?
check "a run that finishes exits 0 (got $code)" test "$code" -eq 0
check "and leaves no stop marker" test ! -e "$work/stopped"

"$gpt_train" train -c "$work/run.yaml" --stop-marker "$work/stopped" > "$work/train.log" 2>&1 &
pid=$!
for _ in $(seq 300); do  # until the run is under way
  [ -f "$work/run/metrics.jsonl" ] && [ "$(wc -l < "$work/run/metrics.jsonl")" -ge 20 ] && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
code=$?
check "train exits 0 after SIGTERM (got $code)" test "$code" -eq 0
check "it logs the stop" grep -q "SIGTERM received: checkpoint saved after signal" "$work/train.log"
check "latest names a step" test -s "$work/run/checkpoints/latest"
check "the stop marker is written" grep -q "stopped early by a signal" "$work/stopped"
[ "$code" -eq 0 ] || tail -n 30 "$work/train.log"

# A signal during the start-up (held there 5 s by the test hook, once the config is read) is kept: the run stops after its first step.
rm -f "$work/stopped"
GPT_TRAIN_FAULT=slow_start:5000 "$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/early" \
  --stop-marker "$work/stopped" > "$work/early.log" 2>&1 &
pid=$!
for _ in $(seq 200); do  # until the hook says the signals are armed (its log line), 20 s at most
  grep -q "slow_start: holding" "$work/early.log" 2> /dev/null && break
  sleep 0.1
done
kill -TERM "$pid"
wait "$pid"
code=$?
check "SIGTERM during the start-up: exit 0 (got $code)" test "$code" -eq 0
check "a checkpoint after step 1" test "$(cat "$work/early/checkpoints/latest" 2> /dev/null)" = step_00000001
check "and the stop marker" test -s "$work/stopped"
[ "$code" -eq 0 ] || tail -n 20 "$work/early.log"

step_dir="$work/run/checkpoints/$(cat "$work/run/checkpoints/latest" 2> /dev/null)"
# Started ignoring SIGINT (as a shell's background job is), it keeps ignoring it; SIGTERM still ends it.
(trap '' INT; exec "$gpt_train" sample --checkpoint "$step_dir" --tokens 10000000 --threads 1) > "$work/sample.log" 2>&1 &
pid=$!
sleep 1
kill -INT "$pid"
sleep 0.5
check "sample started with SIGINT ignored survives SIGINT" kill -0 "$pid"
kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
alive=0
kill -0 "$pid" 2> /dev/null && alive=1 && kill -KILL "$pid"
wait "$pid"
code=$?
check "sample ends within 10 s of SIGTERM" test "$alive" -eq 0
check "with SIGTERM's status 143 (got $code)" test "$code" -eq 143

[ "$fail" -eq 0 ] && echo "PASS: SIGTERM stops training gracefully and ends other commands at once"
exit $fail
