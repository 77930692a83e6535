#!/usr/bin/python3
"""Writes a golden-reference fixture for gpt-train from a checkpoint directory.

Usage:
  /usr/bin/python3 scripts/reference/make_fixture.py --weights DIR --out DIR \
      --batch-size 2 --seq-len 8 --seed 0

Writes into --out: manifest.json + shard files (copied weights), batch.bin
(int32 LE: inputs B*T then targets B*T), reference.json, reference_grads.bin
(float32 LE flat gradient, same layout as the weights).
"""

import argparse
import json
import os
import shutil
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference  # noqa: E402


def make_batch(seed, B, T, V):
    rng = np.random.default_rng(seed)
    inputs = rng.integers(0, V, size=(B, T), dtype=np.int64)
    targets = rng.integers(0, V, size=(B, T), dtype=np.int64)
    return inputs, targets


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="checkpoint dir (manifest.json)")
    ap.add_argument("--out", required=True, help="fixture output dir")
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    manifest = gpt_reference.load_manifest(args.weights)
    V = int(manifest["model"]["vocab_size"])
    block = int(manifest["model"]["block_size"])
    B, T = args.batch_size, args.seq_len
    if B <= 0 or T <= 0 or T > block:
        ap.error("need B > 0 and 0 < T <= block_size (%d)" % block)

    inputs, targets = make_batch(args.seed, B, T, V)
    loss, grads, _ = gpt_reference.loss_and_grads(args.weights, inputs, targets)
    if not np.isfinite(loss) or not np.isfinite(grads).all():
        sys.exit("non-finite loss or gradients")

    os.makedirs(args.out, exist_ok=True)
    same = os.path.realpath(args.weights) == os.path.realpath(args.out)
    if not same:
        shutil.copyfile(os.path.join(args.weights, "manifest.json"),
                        os.path.join(args.out, "manifest.json"))
        for sh in manifest["shards"]:
            shutil.copyfile(os.path.join(args.weights, sh["file"]),
                            os.path.join(args.out, sh["file"]))
        tok = manifest.get("tokenizer")
        if tok and os.path.isfile(os.path.join(args.weights, tok)):
            shutil.copyfile(os.path.join(args.weights, tok),
                            os.path.join(args.out, tok))

    batch = np.concatenate([inputs.reshape(-1), targets.reshape(-1)]).astype("<i4")
    batch.tofile(os.path.join(args.out, "batch.bin"))
    grads.astype("<f4").tofile(os.path.join(args.out, "reference_grads.bin"))

    # Hand-written JSON so the loss keeps all 17 significant digits.
    fields = [
        ("B", json.dumps(B)),
        ("T", json.dumps(T)),
        ("seed", json.dumps(args.seed)),
        ("loss", "%.17g" % loss),
        ("batch_file", json.dumps("batch.bin")),
        ("grad_file", json.dumps("reference_grads.bin")),
        ("grad_dtype", json.dumps("f32")),
        ("grad_numel", json.dumps(int(grads.size))),
        ("compute_dtype", json.dumps("f64")),
        ("torch_version", json.dumps(torch.__version__)),
        ("numpy_version", json.dumps(np.__version__)),
    ]
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        f.write("{\n" + ",\n".join('  "%s": %s' % kv for kv in fields) + "\n}\n")
    print("loss %.17g  grad_numel %d  |grad|max %.3e  -> %s"
          % (loss, grads.size, np.abs(grads).max(), args.out))


if __name__ == "__main__":
    main()
