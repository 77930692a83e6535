"""Float64 PyTorch golden reference for gpt-train's GPT-2 model.

Loads a gpt-train checkpoint directory (manifest.json + shard_*.bin), computes
the mean cross-entropy loss on a (B, T) batch and the gradient of every
parameter, and maps the gradients back into the checkpoint's flat layout.

Run with Debian's interpreter (/usr/bin/python3), which has torch and numpy.
"""

import json
import math
import os

import numpy as np
import torch

BLOCK_PARAMS = (
    "ln_1.weight", "ln_1.bias",
    "attn.qkv.weight", "attn.qkv.bias",
    "attn.proj.weight", "attn.proj.bias",
    "ln_2.weight", "ln_2.bias",
    "mlp.fc.weight", "mlp.fc.bias",
    "mlp.proj.weight", "mlp.proj.bias",
)
LN_EPS = 1e-5


# --------------------------------------------------------------------------
# CRC-32C (Castagnoli), reflected poly 0x82F63B78, init/xorout 0xFFFFFFFF.
# --------------------------------------------------------------------------
def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data, crc=0):
    c = crc ^ 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


# --------------------------------------------------------------------------
# Checkpoint I/O
# --------------------------------------------------------------------------
def load_manifest(weights_dir):
    with open(os.path.join(weights_dir, "manifest.json")) as f:
        return json.load(f)


def total_numel(manifest):
    return max(u["offset"] + u["numel"] for u in manifest["units"])


def read_flat(weights_dir, manifest, verify_crc=True, crc_max_bytes=64 << 20):
    """Returns the whole flat parameter buffer as a float64 numpy array."""
    if manifest.get("dtype", "f32") != "f32":
        raise ValueError("only dtype f32 checkpoints are supported, got %r"
                         % manifest.get("dtype"))
    total = total_numel(manifest)
    flat = np.full(total, np.nan, dtype=np.float64)
    unit_offsets = [int(u["offset"]) for u in manifest["units"]]
    for sh in manifest["shards"]:
        path = os.path.join(weights_dir, sh["file"])
        with open(path, "rb") as f:
            raw = f.read()
        if "slices" in sh:  # version 2: section-major; the master weights are section 0
            if "bytes" in sh and len(raw) != sh["bytes"]:
                raise ValueError("%s: size %d, manifest says %d" % (path, len(raw), sh["bytes"]))
            at = 0
            for sl in sh["slices"]:
                n = int(sl["length"])
                piece = raw[4 * at:4 * (at + n)]
                if verify_crc and len(piece) <= crc_max_bytes and crc32c(piece) != int(sl["crc32c"][0], 16):
                    raise ValueError("%s: crc32c mismatch in unit %d" % (path, sl["unit"]))
                b = unit_offsets[int(sl["unit"])] + int(sl["begin"])
                flat[b:b + n] = np.frombuffer(piece, dtype="<f4").astype(np.float64)
                at += n
            continue
        begin, end = int(sh["begin"]), int(sh["end"])
        if len(raw) != 4 * (end - begin) or ("bytes" in sh and len(raw) != sh["bytes"]):
            raise ValueError("%s: size %d does not match manifest [%d,%d)"
                             % (path, len(raw), begin, end))
        if verify_crc and "crc32c" in sh and len(raw) <= crc_max_bytes:
            got = crc32c(raw)
            want = int(str(sh["crc32c"]), 16) if isinstance(sh["crc32c"], str) \
                else int(sh["crc32c"])
            if got != want:
                raise ValueError("%s: crc32c 0x%08x != manifest 0x%08x"
                                 % (path, got, want))
        flat[begin:end] = np.frombuffer(raw, dtype="<f4").astype(np.float64)
    if np.isnan(flat).any():
        # NaN here means a hole not covered by any shard (or NaN weights).
        raise ValueError("flat buffer has NaNs / is not fully covered by shards")
    return flat


def param_layout(manifest):
    """Yields (full_name, shape, flat_offset, numel), full_name like
    'embed.wte', 'block.0.attn.qkv.weight', 'head.ln_f.weight'."""
    for u in manifest["units"]:
        for p in u["params"]:
            shape = tuple(int(s) for s in p["shape"])
            numel = int(p["numel"])
            if int(np.prod(shape)) != numel:
                raise ValueError("%s.%s: shape %s != numel %d"
                                 % (u["name"], p["name"], shape, numel))
            yield (u["name"] + "." + p["name"], shape,
                   int(u["offset"]) + int(p["offset"]), numel)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------
class GPTReference(torch.nn.Module):
    """GPT-2 with tied embeddings, no dropout, float64 by default."""

    def __init__(self, manifest, flat, dtype=torch.float64):
        super().__init__()
        m = manifest["model"]
        self.n_layer = int(m["n_layer"])
        self.n_head = int(m["n_head"])
        self.n_embd = int(m["n_embd"])
        self.block_size = int(m["block_size"])
        self.vocab_size = int(m["vocab_size"])
        if not m.get("tied_embeddings", True):
            raise ValueError("reference only implements tied embeddings")
        if float(m.get("dropout", 0.0)) != 0.0:
            raise ValueError("reference assumes dropout 0")
        self.layout = list(param_layout(manifest))
        self.total = total_numel(manifest)
        # ParameterDict keys can't contain '.', so keep our own name map.
        self._params = {}
        for i, (name, shape, off, numel) in enumerate(self.layout):
            t = torch.tensor(flat[off:off + numel].reshape(shape), dtype=dtype)
            p = torch.nn.Parameter(t, requires_grad=True)
            self.register_parameter("p%d" % i, p)
            self._params[name] = p
        self._check_shapes()

    def _check_shapes(self):
        C, V, BS = self.n_embd, self.vocab_size, self.block_size
        want = {"embed.wte": (V, C), "embed.wpe": (BS, C),
                "head.ln_f.weight": (C,), "head.ln_f.bias": (C,)}
        per_block = {
            "ln_1.weight": (C,), "ln_1.bias": (C,),
            "attn.qkv.weight": (3 * C, C), "attn.qkv.bias": (3 * C,),
            "attn.proj.weight": (C, C), "attn.proj.bias": (C,),
            "ln_2.weight": (C,), "ln_2.bias": (C,),
            "mlp.fc.weight": (4 * C, C), "mlp.fc.bias": (4 * C,),
            "mlp.proj.weight": (C, 4 * C), "mlp.proj.bias": (C,),
        }
        for l in range(self.n_layer):
            for k, s in per_block.items():
                want["block.%d.%s" % (l, k)] = s
        got = {n: tuple(p.shape) for n, p in self._params.items()}
        if got != want:
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            bad = sorted(k for k in set(want) & set(got) if want[k] != got[k])
            raise ValueError("manifest params mismatch: missing=%s extra=%s "
                             "bad_shape=%s" % (missing, extra, bad))
        if C % self.n_head:
            raise ValueError("n_embd not divisible by n_head")

    def P(self, name):
        return self._params[name]

    # All math written out explicitly (no F.layer_norm / F.gelu) so that it is
    # an independent check of the formulas in the spec.
    @staticmethod
    def layer_norm(x, w, b):
        mean = x.mean(dim=-1, keepdim=True)
        xc = x - mean
        var = (xc * xc).mean(dim=-1, keepdim=True)  # biased variance
        return xc / torch.sqrt(var + LN_EPS) * w + b

    @staticmethod
    def gelu_tanh(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                           * (x + 0.044715 * x * x * x)))

    def attn(self, x, l):
        B, T, C = x.shape
        NH, HS = self.n_head, C // self.n_head
        pre = "block.%d.attn." % l
        qkv = x @ self.P(pre + "qkv.weight").t() + self.P(pre + "qkv.bias")
        q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
        q = q.reshape(B, T, NH, HS).transpose(1, 2)  # (B, NH, T, HS)
        k = k.reshape(B, T, NH, HS).transpose(1, 2)
        v = v.reshape(B, T, NH, HS).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = att - att.max(dim=-1, keepdim=True).values.detach()
        e = torch.exp(att)
        att = e / e.sum(dim=-1, keepdim=True)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return y @ self.P(pre + "proj.weight").t() + self.P(pre + "proj.bias")

    def mlp(self, x, l):
        pre = "block.%d.mlp." % l
        h = x @ self.P(pre + "fc.weight").t() + self.P(pre + "fc.bias")
        h = self.gelu_tanh(h)
        return h @ self.P(pre + "proj.weight").t() + self.P(pre + "proj.bias")

    def logits(self, idx):
        B, T = idx.shape
        if T > self.block_size:
            raise ValueError("T=%d > block_size=%d" % (T, self.block_size))
        wte = self.P("embed.wte")
        x = wte[idx] + self.P("embed.wpe")[:T]
        for l in range(self.n_layer):
            pre = "block.%d." % l
            x = x + self.attn(self.layer_norm(x, self.P(pre + "ln_1.weight"),
                                              self.P(pre + "ln_1.bias")), l)
            x = x + self.mlp(self.layer_norm(x, self.P(pre + "ln_2.weight"),
                                             self.P(pre + "ln_2.bias")), l)
        x = self.layer_norm(x, self.P("head.ln_f.weight"), self.P("head.ln_f.bias"))
        return x @ wte.t()

    def forward(self, idx, targets):
        logits = self.logits(idx)
        # mean cross-entropy via explicit log-softmax
        mx = logits.max(dim=-1, keepdim=True).values.detach()
        lse = torch.log(torch.exp(logits - mx).sum(dim=-1)) + mx.squeeze(-1)
        picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return (lse - picked).mean()

    def flat_grads(self):
        g = np.full(self.total, np.nan, dtype=np.float64)
        for name, shape, off, numel in self.layout:
            p = self._params[name]
            gp = p.grad if p.grad is not None else torch.zeros_like(p)
            g[off:off + numel] = gp.detach().reshape(-1).cpu().numpy()
        return g


def loss_and_grads(weights_dir, inputs, targets, verify_crc=True):
    """inputs/targets: (B, T) integer arrays. Returns (loss: float,
    grads: float64 numpy array in the checkpoint's flat layout, model)."""
    manifest = load_manifest(weights_dir)
    flat = read_flat(weights_dir, manifest, verify_crc=verify_crc)
    model = GPTReference(manifest, flat)
    idx = torch.as_tensor(np.asarray(inputs), dtype=torch.int64)
    tgt = torch.as_tensor(np.asarray(targets), dtype=torch.int64)
    V = model.vocab_size
    if idx.min() < 0 or idx.max() >= V or tgt.min() < 0 or tgt.max() >= V:
        raise ValueError("token ids out of range [0, %d)" % V)
    model.zero_grad(set_to_none=True)
    loss = model(idx, tgt)
    loss.backward()
    return float(loss.item()), model.flat_grads(), model
