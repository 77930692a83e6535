#!/usr/bin/env bash
# Hybrid sharding's shard groups are consecutive world ranks, meant to be one node's: under mpirun -np 4 with
# shard groups of 2, ranks placed node by node (here all on one host) train without a placement warning, and a
# cyclic placement over two nodes (the test hook fake_nodes:2 puts rank r on node r % 2) trains the same losses
# but rank 0 warns that shard group 0 spans 2 nodes and says how to place the ranks.
set -uo pipefail
gpt_train="$1"
source "$(dirname "$0")/lib.sh"
prepare_data 200 "now is the winter of our discontent" 7
cat > "$work/run.yaml" <<YAML
run: {threads: 1, seed: 5}
model: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16}
data: {train: $work/data/train.bin, val: $work/data/val.bin}
training: {steps: 3, micro_batch_size: 2, global_batch_sequences: 8, eval_interval: 0, eval_batches: 1}
parallel: {strategy: hybrid, shard_group_size: 2}
logging: {log_interval: 1}
YAML
run() {  # run NAME [FAULT]
  GPT_TRAIN_FAULT=${2:-} timeout 120 mpirun -np 4 --oversubscribe -x GPT_TRAIN_FAULT "$gpt_train" train \
    -c "$work/run.yaml" --set run.out_dir="$work/$1" > "$work/$1.log" 2>&1
}
run block
code=$?
check "node by node: exit 0 (got $code)" test "$code" -eq 0
check "and no placement warning" bash -c "! grep -q 'spans .* nodes' '$work/block.log'"
run cyclic fake_nodes:2
code=$?
check "cyclic over 2 nodes: exit 0 (got $code)" test "$code" -eq 0
check "rank 0 warns that shard group 0 spans 2 nodes" \
  grep -q "shard_group_size 2: shard group 0 (world ranks 0..1) spans 2 nodes.*srun --distribution=block" \
  "$work/cyclic.log"
losses() { grep -oE '"(step|loss|val_loss)":[^,]*' "$work/$1/metrics.jsonl"; }
check "the same losses either way" test "$(losses block)" = "$(losses cyclic)" -a -n "$(losses block)"
[ "$fail" -eq 0 ] || tail -n 20 "$work/cyclic.log"
[ "$fail" -eq 0 ] && echo "PASS: a shard group spread over nodes is named, with the placement that fixes it"
exit $fail
