#!/usr/bin/env bash
# Checkpoints survive faults, end to end through the gpt-train binary:
#   1. a rank SIGKILLed while saving (mpirun -np 2, zero3): the job ends, the previous checkpoint still
#      verifies and `latest` names it; --resume auto continues from it, removes the half-written directory on
#      its next save, and ends with the same final loss as an uninterrupted run;
#   2. the disk refusing writes while saving (GPT_TRAIN_FAULT=file_size_limit: RLIMIT_FSIZE set at the save,
#      so the kernel fails writes past the limit with EFBIG): a clear error naming the file, a non-zero exit,
#      the previous checkpoint intact and still `latest`;
#   3. resuming with another model shape, or from a checkpoint with a flipped byte: exit 2 with the key or
#      the file named, and nothing written (metrics and checkpoints unchanged).
set -uo pipefail
gpt_train="$1"
source "$(dirname "$0")/lib.sh"
final_loss() { grep -o '"step":6,"loss":[0-9.]*' "$1/metrics.jsonl"; }

prepare_data 400 "the quick brown fox jumps over the lazy dog" 13
cat > "$work/run.yaml" <<YAML
run: {out_dir: $work/run, threads: 1, seed: 7}
model: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, dropout: 0.1}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: 6, micro_batch_size: 2, global_batch_sequences: 4, eval_interval: 0, eval_batches: 1,
           warmup_steps: 1}
parallel: {strategy: zero3}
checkpoint: {every: 2, keep_last: 2}
YAML
mpi() { timeout 120 mpirun -np 2 --oversubscribe -x GPT_TRAIN_FAULT "$@"; }
export GPT_TRAIN_FAULT=
ck="$work/run/checkpoints"

# The uninterrupted reference.
mpi "$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/ref" > "$work/ref.log" 2>&1 || {
  cat "$work/ref.log"; exit 1; }
ref=$(final_loss "$work/ref")

# 1. Rank 1 dies while writing step 4.
GPT_TRAIN_FAULT=kill_during_save:1:4 mpi "$gpt_train" train -c "$work/run.yaml" > "$work/kill.log" 2>&1
code=$?
check "the job ends when a rank is killed while saving (exit $code)" test "$code" -ne 0 -a "$code" -ne 124
check "latest still names step 2" test "$(cat "$ck/latest")" = step_00000002
check "the half-written step 4 is not a checkpoint" test ! -e "$ck/step_00000004"
check "it is left as a temporary directory" test -d "$ck/.tmp-step_00000004"
check "step 2 verifies" "$gpt_train" checkpoint verify "$ck/step_00000002"
mpi "$gpt_train" train -c "$work/run.yaml" --resume auto > "$work/resume.log" 2>&1
check "--resume auto finishes (exit $?)" grep -q "resumed from $ck/step_00000002" "$work/resume.log"
check "the leftover is cleaned up by the next save" test ! -e "$ck/.tmp-step_00000004"
check "final loss equals the uninterrupted run's ($ref)" test "$(final_loss "$work/run")" = "$ref"
check "keep_last 2 keeps steps 4 and 6" test "$(ls "$ck" | tr '\n' ' ')" = "latest step_00000004 step_00000006 "

# 2. The disk refuses writes past 24 KiB per file from the step-8 save on.
out=$(GPT_TRAIN_FAULT=file_size_limit:24576 "$gpt_train" train -c "$work/run.yaml" --set parallel.strategy=single \
  --set training.steps=8 --resume auto 2>&1)
code=$?
check "a failed write stops the run (exit $code)" test "$code" -ne 0
check "the error names the file and the cause" grep -q "shard_00000.bin.tmp: write failed: File too large" <<< "$out"
check "latest still names step 6" test "$(cat "$ck/latest")" = step_00000006
check "no step 8" test ! -e "$ck/step_00000008"
check "nor its temporary directory" test ! -e "$ck/.tmp-step_00000008"
check "step 6 verifies" "$gpt_train" checkpoint verify "$ck/step_00000006"

# 3. Bad resumes write nothing.
before=$(cat "$work/run/metrics.jsonl" "$ck/latest" | md5sum)
out=$("$gpt_train" train -c "$work/run.yaml" --set parallel.strategy=single --set model.n_embd=64 --resume auto 2>&1)
code=$?
check "another model shape: exit 2 (got $code)" test "$code" -eq 2
check "the error names the key and the checkpoint" grep -q "model.n_embd is 64 but the checkpoint $ck/step_00000006/manifest.json has 32" <<< "$out"
printf '\x7f' | dd of="$ck/step_00000006/shard_00001.bin" bs=1 seek=100 conv=notrunc status=none
out=$("$gpt_train" train -c "$work/run.yaml" --set parallel.strategy=single --resume auto 2>&1)
code=$?
check "a flipped byte: exit 2 (got $code)" test "$code" -eq 2
check "the error names the shard file" grep -q "$ck/step_00000006/shard_00001.bin: checksum mismatch" <<< "$out"
check "nothing was written" test "$(cat "$work/run/metrics.jsonl" "$ck/latest" | md5sum)" = "$before"

[ "$fail" -eq 0 ] && echo "PASS: checkpoints survive a killed rank, a full disk and bad resumes"
exit $fail
