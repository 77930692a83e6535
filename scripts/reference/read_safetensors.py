#!/usr/bin/env python3
"""An independent check of `gpt-train checkpoint consolidate`: reads a safetensors file with json + numpy only
and compares it with the checkpoint or model directory it came from, read straight from manifest.json and the
shard files (not through gpt-train's reader).

Checks the container (8-byte little-endian header length, JSON header, 8-byte aligned data section, F32
tensors whose data_offsets tile the data section exactly, __metadata__ with string values and "format": "pt"),
that the tensor names are exactly Hugging Face GPT-2's (wte.weight, wpe.weight, h.<i>.ln_1.weight, ...,
ln_f.bias), their shapes (Conv1D weights c_attn, c_proj, c_fc stored (in, out)), and that every value equals
the master weights bit for bit. Exit 0 and "OK: ..." when all holds; 1 and the first problem otherwise.

    /usr/bin/python3 scripts/reference/read_safetensors.py model.safetensors --source runs/x/checkpoints/step_00001000
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

# (gpt-train name within a block unit, Hugging Face name within h.<i>, stored transposed)
BLOCK = [
    ("ln_1.weight", "ln_1.weight", False),
    ("ln_1.bias", "ln_1.bias", False),
    ("attn.qkv.weight", "attn.c_attn.weight", True),
    ("attn.qkv.bias", "attn.c_attn.bias", False),
    ("attn.proj.weight", "attn.c_proj.weight", True),
    ("attn.proj.bias", "attn.c_proj.bias", False),
    ("ln_2.weight", "ln_2.weight", False),
    ("ln_2.bias", "ln_2.bias", False),
    ("mlp.fc.weight", "mlp.c_fc.weight", True),
    ("mlp.fc.bias", "mlp.c_fc.bias", False),
    ("mlp.proj.weight", "mlp.c_proj.weight", True),
    ("mlp.proj.bias", "mlp.c_proj.bias", False),
]


class Mismatch(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Mismatch(msg)


def read_safetensors(path):
    """{name: np.ndarray}, metadata; checks the container."""
    with open(path, "rb") as f:
        blob = f.read()
    check(len(blob) >= 8, f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    check(8 + n <= len(blob), f"{path}: header length {n} runs past the end of the file")
    check((8 + n) % 8 == 0, f"{path}: data section starts at byte {8 + n}, not a multiple of 8")
    raw = blob[8:8 + n].decode("utf-8")
    check(raw.rstrip(" ") == raw.strip(), f"{path}: header has padding other than trailing spaces")
    header = json.loads(raw)
    data = blob[8 + n:]
    meta = header.pop("__metadata__", None)
    check(isinstance(meta, dict), f"{path}: no __metadata__")
    check(all(isinstance(v, str) for v in meta.values()), f"{path}: __metadata__ values must be strings")
    check(meta.get("format") == "pt", f"{path}: __metadata__.format is {meta.get('format')!r}, expected 'pt'")
    spans = []
    tensors = {}
    for name, t in header.items():
        check(set(t) == {"dtype", "shape", "data_offsets"}, f"{path}: {name}: keys {sorted(t)}")
        check(t["dtype"] == "F32", f"{path}: {name}: dtype {t['dtype']}")
        begin, end = t["data_offsets"]
        numel = int(np.prod(t["shape"], dtype=np.int64))
        check(end - begin == 4 * numel, f"{path}: {name}: data_offsets {begin}..{end} do not hold shape {t['shape']}")
        spans.append((begin, end, name))
        tensors[name] = np.frombuffer(data, dtype="<f4", count=numel, offset=begin).reshape(t["shape"])
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        check(begin == pos, f"{path}: {name} starts at {begin}, expected {pos} (gap or overlap)")
        pos = end
    check(pos == len(data), f"{path}: tensors end at {pos} but the data section has {len(data)} bytes")
    return tensors, meta


def read_master(source):
    """{unit name: {param name: np.ndarray}} of section master, from the manifest and shard files."""
    with open(os.path.join(source, "manifest.json")) as f:
        m = json.load(f)
    units = m["units"]
    flat = [np.full(u["numel"], np.nan, dtype=np.float32) for u in units]
    filled = [np.zeros(u["numel"], dtype=bool) for u in units]
    sections = m.get("sections", ["master"])
    sec = sections.index("master")
    for shard in m["shards"]:
        buf = np.fromfile(os.path.join(source, shard["file"]), dtype="<f4")
        if "slices" not in shard:  # version 1: the whole flat buffer, units in order
            shard["slices"] = [{"unit": i, "begin": 0, "length": u["numel"]} for i, u in enumerate(units)]
        total = sum(s["length"] for s in shard["slices"])
        check(buf.size == total * len(sections), f"{shard['file']}: {buf.size} floats, expected {total * len(sections)}")
        pos = sec * total
        for s in shard["slices"]:
            u, b, n = s["unit"], s["begin"], s["length"]
            flat[u][b:b + n] = buf[pos:pos + n]
            filled[u][b:b + n] = True
            pos += n
    for u, f in zip(units, filled):
        check(f.all(), f"{source}: unit {u['name']} not fully covered by the shards")
    out = {}
    for u, buf in zip(units, flat):
        out[u["name"]] = {p["name"]: buf[p["offset"]:p["offset"] + p["numel"]].reshape(p["shape"]) for p in u["params"]}
    return out, m["model"]


def expected_tensors(master, model):
    exp = {
        "wte.weight": master["embed"]["wte"],
        "wpe.weight": master["embed"]["wpe"],
        "ln_f.weight": master["head"]["ln_f.weight"],
        "ln_f.bias": master["head"]["ln_f.bias"],
    }
    for i in range(model["n_layer"]):
        unit = master[f"block.{i}"]
        for ours, hf, transpose in BLOCK:
            exp[f"h.{i}.{hf}"] = unit[ours].T if transpose else unit[ours]
    return exp


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("safetensors")
    ap.add_argument("--source", required=True, help="the checkpoint or model directory it was consolidated from")
    args = ap.parse_args()
    try:
        tensors, meta = read_safetensors(args.safetensors)
        master, model = read_master(args.source)
        exp = expected_tensors(master, model)
        C, V, T = model["n_embd"], model["vocab_size"], model["block_size"]
        check(exp["wte.weight"].shape == (V, C) and exp["wpe.weight"].shape == (T, C), "manifest shapes")
        check(exp["h.0.attn.c_attn.weight"].shape == (C, 3 * C), "c_attn must be stored (C, 3C)")
        check(exp["h.0.mlp.c_fc.weight"].shape == (C, 4 * C), "c_fc must be stored (C, 4C)")
        check(exp["h.0.mlp.c_proj.weight"].shape == (4 * C, C), "mlp c_proj must be stored (4C, C)")
        missing, extra = sorted(set(exp) - set(tensors)), sorted(set(tensors) - set(exp))
        check(not missing and not extra, f"tensor names differ: missing {missing}, unexpected {extra}")
        values = 0
        for name, want in exp.items():
            got = tensors[name]
            check(got.shape == want.shape, f"{name}: shape {list(got.shape)}, expected {list(want.shape)}")
            bad = np.flatnonzero(got.view(np.uint32).ravel() != np.ascontiguousarray(want).view(np.uint32).ravel())
            check(bad.size == 0, f"{name}: {bad.size} of {want.size} values differ, first at flat index "
                  f"{bad[0] if bad.size else -1}: {got.ravel()[bad[0]] if bad.size else 0} vs "
                  f"{want.ravel()[bad[0]] if bad.size else 0}")
            values += want.size
    except Mismatch as e:
        print(f"MISMATCH: {e}")
        return 1
    print(f"OK: {len(tensors)} tensors, {values} values equal to the master weights of {args.source} "
          f"(metadata {json.dumps(meta, sort_keys=True)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
