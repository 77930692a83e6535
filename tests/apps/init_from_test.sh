#!/usr/bin/env bash
# checkpoint.init_from (fine-tuning): a run starts from another run's weights, at step 0, at any world size and
# strategy. With a learning rate of 1e-30 no weight moves in one step (each update is far below half an ulp), so
# the weights the run saves at its end must be the loaded ones bit for bit: from a model directory on one process,
# and from a checkpoint root (its latest step) under zero3 on two. A different model shape is an error naming the
# key and the file; a checkpoint that --resume auto finds wins over init_from.
set -uo pipefail
gpt_train="$1"
source "$(dirname "$0")/lib.sh"
prepare_data 300 "to be or not to be that is the question" 11
cat > "$work/run.yaml" <<YAML
run: {threads: 1, seed: 7}
model: {n_layer: 2, n_head: 2, n_embd: 16, block_size: 16}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: 6, micro_batch_size: 2, global_batch_sequences: 4, eval_interval: 0, eval_batches: 1,
           lr: 1.0e-2, warmup_steps: 0}
checkpoint: {every: 3}
YAML
# Training that moves nothing: one step at lr 1e-30, no weight decay.
still=(--set training.steps=1 --set training.lr=1e-30 --set training.min_lr=0 --set training.weight_decay=0
       --set checkpoint.every=0)
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/a" > "$work/a.log" 2>&1
code=$?
check "the source run trains: exit 0 (got $code)" test "$code" -eq 0

# Whether two model directories hold the same weights, bit for bit: their consolidated safetensors files past the
# header (which names the step), at least one parameter long.
same_weights() {
  local n
  n=$("$gpt_train" checkpoint inspect "$1" | sed -nE 's/^ *parameters: *([0-9]+).*/\1/p')
  "$gpt_train" checkpoint consolidate "$1" --out "$work/x.safetensors" > /dev/null 2>&1 &&
    "$gpt_train" checkpoint consolidate "$2" --out "$work/y.safetensors" > /dev/null 2>&1 &&
    [ "${n:-0}" -gt 0 ] && cmp -s <(tail -c $((4 * n)) "$work/x.safetensors") <(tail -c $((4 * n)) "$work/y.safetensors")
}
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/b" --set checkpoint.init_from="$work/a/model" \
  "${still[@]}" > "$work/b.log" 2>&1
code=$?
check "init_from a model directory: exit 0 (got $code)" test "$code" -eq 0
check "it says where the weights came from" grep -q "initial weights from $work/a/model (a model of step 6)" "$work/b.log"
check "the weights it saved are the loaded ones, bit for bit" same_weights "$work/a/model" "$work/b/model"

timeout 120 mpirun -np 2 --oversubscribe "$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/c" \
  --set parallel.strategy=zero3 --set checkpoint.init_from="$work/a/checkpoints" "${still[@]}" > "$work/c.log" 2>&1
code=$?
check "init_from a checkpoint root under zero3 on 2 ranks: exit 0 (got $code)" test "$code" -eq 0
check "it read the root's latest step" grep -q "initial weights from $work/a/checkpoints/step_00000006 (a checkpoint of step 6)" "$work/c.log"
check "the same weights, bit for bit" same_weights "$work/a/model" "$work/c/model"
not() { ! "$@"; }
check "(which the source run's step 3 are not)" not same_weights "$work/a/model" "$work/a/checkpoints/step_00000003"

# The step's forward runs on the loaded weights too, not only the master copy: zero1 with bf16 parameters (published
# from the master weights after the load) on 2 ranks has the first loss of the single fp32 run within bf16's
# rounding, where a fresh init's (the source run's first step, on the same batch) is far above.
timeout 120 mpirun -np 2 --oversubscribe "$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/z" \
  --set parallel.strategy=zero1 --set parallel.param_dtype=bf16 --set checkpoint.init_from="$work/a/model" \
  "${still[@]}" > "$work/z.log" 2>&1
code=$?
check "zero1 with bf16 parameters on 2 ranks: exit 0 (got $code)" test "$code" -eq 0
first_loss() { sed -nE '1s/.*"loss":([0-9.]+).*/\1/p' "$work/$1/metrics.jsonl"; }
fresh=$(first_loss a) loaded=$(first_loss b) bf16=$(first_loss z)
echo "first losses: fresh init $fresh, loaded $loaded, loaded under zero1 bf16 $bf16"
check "the loaded model's first loss is well below a fresh init's" \
  awk -v f="$fresh" -v l="$loaded" 'BEGIN { exit !(l != "" && f - l > 0.1) }'
check "and zero1's bf16 parameters give it within 2e-2" \
  awk -v b="$bf16" -v l="$loaded" 'BEGIN { d = b - l; exit !(b != "" && d < 2e-2 && d > -2e-2) }'

"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/d" --set checkpoint.init_from="$work/a/model" \
  --set model.n_embd=32 "${still[@]}" > "$work/d.log" 2>&1
code=$?
check "another model shape: exit 2 (got $code)" test "$code" -eq 2
check "naming the key and the file" grep -q "model.n_embd is 32 but checkpoint.init_from's $work/a/model/manifest.json has 16; the initial weights load only into the same model shape" "$work/d.log"
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/e" --set checkpoint.init_from="$work/nowhere" \
  "${still[@]}" > "$work/e.log" 2>&1
code=$?
check "a missing directory: exit 2 (got $code)" test "$code" -eq 2
check "naming checkpoint.init_from" grep -q "checkpoint.init_from: .*$work/nowhere" "$work/e.log"

# A smaller block_size crops wpe (the run's embed unit is a prefix of the saved one), as nanoGPT's crop_block_size;
# a larger one is an error. A run's out_dir stands for its final model.
short=(--set model.block_size=8 --set training.steps=1)
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/g" --set checkpoint.init_from="$work/a" \
  "${short[@]}" > "$work/g.log" 2>&1
code=$?
check "init_from a run's out_dir at block_size 8 of 16: exit 0 (got $code)" test "$code" -eq 0
check "it read the run's final model, wpe cropped" grep -q "wpe cropped to its first 8 positions" "$work/g.log"
check "  (from $work/a/model)" grep -q "initial weights from $work/a/model " "$work/g.log"
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/h" "${short[@]}" > "$work/h.log" 2>&1
cropped=$(first_loss g) fresh8=$(first_loss h)
echo "first losses at block_size 8: cropped init $cropped, fresh init $fresh8"
check "the cropped model's first loss is well below a fresh init's" \
  awk -v f="$fresh8" -v l="$cropped" 'BEGIN { exit !(l != "" && f - l > 0.1) }'
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/i" --set checkpoint.init_from="$work/a/model" \
  --set model.block_size=32 "${still[@]}" > "$work/i.log" 2>&1
check "a larger block_size: an error that says a smaller one loads" grep -q "model.block_size is 32 but .* has 16; .*or a smaller block_size: wpe cropped" "$work/i.log"

# Data tokenized with another vocabulary of the same size: it loads, with a warning that the ids mean other tokens.
for i in $(seq 300); do echo "to be or not to be that is the zuestion $((i % 11))"; done > "$work/other.txt"
"$gpt_train" prepare --input "$work/other.txt" --out "$work/data2" > /dev/null 2>&1
"$gpt_train" train -c "$work/run.yaml" --set run.out_dir="$work/j" --set checkpoint.init_from="$work/a/model" \
  --set data.train="$work/data2/train.bin" --set data.val="$work/data2/val.bin" "${still[@]}" > "$work/j.log" 2>&1
code=$?
check "another vocabulary of the same size: exit 0 (got $code)" test "$code" -eq 0
check "with a warning that the ids are other tokens" grep -q "tokenizer differs from this run's data's" "$work/j.log"
check "(none for the same data)" not grep -q "tokenizer differs" "$work/b.log"

# A fine-tuning run that checkpoints and is requeued: --resume auto finds its own checkpoint and init_from is not read.
ft=(-c "$work/run.yaml" --set run.out_dir="$work/f" --set checkpoint.init_from="$work/a/model" --set checkpoint.every=1)
"$gpt_train" train "${ft[@]}" --set training.steps=2 > "$work/f1.log" 2>&1
"$gpt_train" train "${ft[@]}" --set training.steps=3 --resume auto > "$work/f2.log" 2>&1
code=$?
check "requeued: exit 0 (got $code)" test "$code" -eq 0
check "it resumes its own checkpoint, not init_from" grep -q "checkpoint.init_from $work/a/model not read: the run resumes from $work/f/checkpoints/step_00000002" "$work/f2.log"
[ "$fail" -eq 0 ] || tail -n 5 "$work"/*.log
[ "$fail" -eq 0 ] && echo "PASS: checkpoint.init_from starts a run from another's weights at any world size"
exit $fail
