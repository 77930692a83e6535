#!/usr/bin/env bash
# Regenerates tests/fixtures/reference: trains the tiny model of tests/fixtures/reference/tiny.yaml for a few
# steps with gpt-train (so biases and LayerNorm weights are no longer at their init), then computes the
# loss and every gradient on a fixed batch with the float64 PyTorch reference. Needs Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# An 11-symbol corpus: 10 letters and the newline.
/usr/bin/python3 -c "
import random
r = random.Random(0)
print('\n'.join(''.join(r.choice('abcdefghij') for _ in range(r.randint(3, 30))) for _ in range(400)))
" > "$work/corpus.txt"
build/gpt-train prepare --input "$work/corpus.txt" --out "$work/data"
build/gpt-train train --config tests/fixtures/reference/tiny.yaml --set data.train="$work/data/train.bin" \
  --set data.val="$work/data/val.bin" --set run.out_dir="$work/run"
/usr/bin/python3 scripts/reference/make_fixture.py --weights "$work/run/model" --out tests/fixtures/reference \
  --batch-size 2 --seq-len 8 --seed 0
