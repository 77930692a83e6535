#!/usr/bin/env python3
"""An independent check of `gpt-train checkpoint consolidate --out DIR/`: reads DIR/config.json and
DIR/model.safetensors with json + numpy only, runs Hugging Face's GPT2LMHeadModel forward as its config
describes it (Conv1D layers x @ W + b, LayerNorm with layer_norm_epsilon, activation_function gelu_new (tanh),
causal attention scaled by 1/sqrt(head size), the LM head tied to wte), and greedily continues the given token
ids, printing them space-separated (the prompt's first), as `gpt-train sample --ids --top-k 1` does. The two
agree when the exported weights and config mean what gpt-train's model computes.

    /usr/bin/python3 scripts/reference/hf_gpt2_greedy.py DIR --prompt-ids 1,2,3 --tokens 8
"""
import argparse
import json
import math
import os
import struct

import numpy as np


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{name}: dtype {t['dtype']}, expected F32")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(t["shape"]).astype(np.float64)
    return out


def layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def logits(w, cfg, ids):
    if cfg["activation_function"] != "gelu_new" or not cfg.get("tie_word_embeddings", True):
        raise SystemExit("config.json: expected activation_function gelu_new and tied word embeddings")
    T, C, H, eps = len(ids), cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    x = w["wte.weight"][ids] + w["wpe.weight"][:T]
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        q, k, v = np.split(h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"], 3, axis=-1)
        q, k, v = (a.reshape(T, H, C // H).transpose(1, 0, 2) for a in (q, k, v))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(C // H)
        s[:, mask] = -np.inf
        s = np.exp(s - s.max(-1, keepdims=True))
        y = (s / s.sum(-1, keepdims=True)) @ v
        y = y.transpose(1, 0, 2).reshape(T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], eps)
    return x[-1] @ w["wte.weight"].T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--prompt-ids", required=True)
    ap.add_argument("--tokens", type=int, default=8)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.dir, "config.json")))
    w = load(os.path.join(a.dir, "model.safetensors"))
    if w["wte.weight"].shape[0] != cfg["vocab_size"] or w["wpe.weight"].shape[0] != cfg["n_positions"]:
        raise SystemExit("config.json: vocab_size or n_positions does not match the tensors' shapes")
    ids = [int(t) for t in a.prompt_ids.split(",")]
    for _ in range(a.tokens):
        ids.append(int(np.argmax(logits(w, cfg, ids[-cfg["n_positions"]:]))))
    print(" ".join(map(str, ids)))


if __name__ == "__main__":
    main()
