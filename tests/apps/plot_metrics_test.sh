#!/usr/bin/env bash
# scripts/plot_metrics.py draws real runs' metrics.jsonl (two runs, one resumed after a checkpoint so that it
# has repeated steps) into a PNG, and rejects a corrupt metrics file naming its line.
set -uo pipefail
gpt_train="$1"
plot="$(cd "$(dirname "$0")/../.." && pwd)/scripts/plot_metrics.py"
if ! /usr/bin/python3 -c "import matplotlib, numpy" 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 lacks matplotlib (apt-get install python3-matplotlib; scripts/setup.sh does)"
  exit 0
fi
source "$(dirname "$0")/lib.sh"
prepare_data 300 "now is the winter of our discontent" 9
for run in a b; do
  "$gpt_train" train --set run.out_dir="$work/$run" --set data.train="$work/data/train.bin" \
    --set data.val="$work/data/val.bin" --set training.steps=40 --set training.eval_interval=10 \
    --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set model.block_size=16 \
    --set checkpoint.every=20 > /dev/null 2>&1 || { echo "FAIL: training run $run"; exit 1; }
done
"$gpt_train" train --set run.out_dir="$work/b" --set data.train="$work/data/train.bin" \
  --set data.val="$work/data/val.bin" --set training.steps=40 --set training.eval_interval=10 \
  --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 --set model.block_size=16 \
  --resume "$work/b/checkpoints/step_00000020" > /dev/null 2>&1 || { echo "FAIL: resumed run"; exit 1; }
/usr/bin/python3 "$plot" "$work/a" "$work/b/metrics.jsonl" --labels a,b --out "$work/m.png" || fail=1
if [ "$(head -c 8 "$work/m.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] && \
   [ "$(stat -c %s "$work/m.png")" -gt 20000 ]; then
  echo "ok: a PNG of $(stat -c %s "$work/m.png") bytes"
else
  echo "FAIL: no PNG written"; fail=1
fi
echo '{"step":1,"loss":2.0}' > "$work/bad.jsonl"
echo 'not json' >> "$work/bad.jsonl"
out=$(/usr/bin/python3 "$plot" "$work/bad.jsonl" --out "$work/bad.png" 2>&1)
if [ $? -ne 0 ] && grep -q "bad.jsonl:2: not a JSON line" <<< "$out"; then echo "ok: a corrupt line is named"; else
  echo "FAIL: corrupt metrics not reported: $out"; fail=1; fi
[ "$fail" -eq 0 ] && echo "PASS: plot_metrics.py"
exit $fail
