"""Reproduction of nanoGPT's CPU run on character-level Shakespeare.

A from-memory PyTorch transcription of karpathy/nanoGPT's model.py and
train.py, fixed to the settings of the README's CPU command:

    python train.py config/train_shakespeare_char.py --device=cpu --compile=False
        --eval_iters=20 --log_interval=1 --block_size=64 --batch_size=12
        --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
        --lr_decay_iters=2000 --dropout=0.0

(README: val loss 1.88.) It exists to give gpt-train's C++ trainer a baseline.
The order of random draws follows train.py: seed, model init, first train
batch, then per iteration an optional evaluation (train split, then val)
followed by one step that fetches the next batch. Loss is estimated at every
multiple of --eval-interval, the last time after --max-iters updates; then
--final-eval-iters more batches per split give a less noisy loss.

Data: llm.c-layout token files (256 int32 header: magic 20240520, version 1,
token count; then uint16 tokens), e.g. data/shakespeare_char/{train,val}.bin.

Run with Debian's interpreter (/usr/bin/python3), which has torch and numpy:

    OMP_WAIT_POLICY=passive /usr/bin/python3 \
        scripts/reference/nanogpt_shakespeare_char.py --seed 1337
"""

import argparse
import math
import os
import sys
import time

# Must be set before torch (libgomp) loads; spinning OpenMP threads hurt
# badly on machines with few cores.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

HEADER_INTS = 256
MAGIC = 20240520
VERSION = 1


# --------------------------------------------------------------------------
# Model (nanoGPT model.py, non-flash attention path)
# --------------------------------------------------------------------------
class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's nn.LayerNorm always has one)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        self.n_embd = cfg.n_embd
        self.register_buffer(
            "bias",
            torch.tril(torch.ones(cfg.block_size, cfg.block_size)).view(
                1, 1, cfg.block_size, cfg.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU(approximate="tanh" if cfg.gelu == "tanh" else "none")
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=LayerNorm(cfg.n_embd, bias=cfg.bias),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def get_num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wpe.weight.numel()
        return n

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        assert t <= self.cfg.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        tok_emb = self.transformer.wte(idx)
        pos_emb = self.transformer.wpe(pos)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for p in param_dict.values() if p.dim() >= 2]
        nodecay_params = [p for p in param_dict.values() if p.dim() < 2]
        groups = [
            {"params": decay_params, "weight_decay": weight_decay},
            {"params": nodecay_params, "weight_decay": 0.0},
        ]
        print(f"num decayed parameter tensors: {len(decay_params)}, with "
              f"{sum(p.numel() for p in decay_params):,} parameters")
        print(f"num non-decayed parameter tensors: {len(nodecay_params)}, with "
              f"{sum(p.numel() for p in nodecay_params):,} parameters")
        # nanoGPT uses fused=True only on CUDA; this script is CPU-only.
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------
def load_tokens(path):
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header.size != HEADER_INTS or header[0] != MAGIC or header[1] != VERSION:
        sys.exit(f"{path}: not an llm.c token file (magic {MAGIC}, version {VERSION})")
    n = int(header[2])
    data = np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_INTS * 4)
    if data.size != n:
        sys.exit(f"{path}: header says {n} tokens, file holds {data.size}")
    return data


# --------------------------------------------------------------------------
# Training (nanoGPT train.py)
# --------------------------------------------------------------------------
def parse_args():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", default=os.path.join(repo, "data", "shakespeare_char"))
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--final-eval-iters", type=int, default=200,
                   help="batches per split for an extra loss estimate at the end (0: skip)")
    p.add_argument("--bias", action="store_true", help="biases in Linear and LayerNorm")
    p.add_argument("--gelu", choices=("exact", "tanh"), default="exact")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--log-interval", type=int, default=1)
    # nanoGPT's CPU command / config/train_shakespeare_char.py / train.py defaults
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--max-iters", type=int, default=2000)
    p.add_argument("--lr-decay-iters", type=int, default=2000)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup-iters", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=1e-1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--vocab-size", type=int, default=65)
    return p.parse_args()


def main():
    a = parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    data = {s: load_tokens(os.path.join(a.data_dir, f"{s}.bin")) for s in ("train", "val")}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
    print(f"train {len(data['train']):,} tokens, val {len(data['val']):,} tokens")
    print(f"seed {a.seed}, bias {a.bias}, gelu {a.gelu}")

    def get_batch(split):
        d = data[split]
        ix = torch.randint(len(d) - a.block_size, (a.batch_size,))
        x = torch.stack([torch.from_numpy(d[i:i + a.block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(d[i + 1:i + 1 + a.block_size].astype(np.int64))
                         for i in ix])
        return x, y

    model = GPT(a)
    print(f"number of parameters: {model.get_num_params() / 1e6:.2f}M")
    optimizer = model.configure_optimizers(a.weight_decay, a.learning_rate, (a.beta1, a.beta2))

    @torch.no_grad()
    def estimate_loss(iters):
        out = {}
        model.eval()
        for split in ("train", "val"):
            losses = torch.zeros(iters)
            for k in range(iters):
                x, y = get_batch(split)
                _, loss = model(x, y)
                losses[k] = loss.item()
            out[split] = losses.mean().item()
        model.train()
        return out

    def get_lr(it):
        if it < a.warmup_iters:
            return a.learning_rate * (it + 1) / (a.warmup_iters + 1)
        if it > a.lr_decay_iters:
            return a.min_lr
        ratio = (it - a.warmup_iters) / (a.lr_decay_iters - a.warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
        return a.min_lr + coeff * (a.learning_rate - a.min_lr)

    start = time.time()
    x, y = get_batch("train")
    t0 = time.time()
    iter_num = 0
    last = None
    while True:
        lr = get_lr(iter_num)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if iter_num % a.eval_interval == 0 or iter_num == a.max_iters:
            last = estimate_loss(a.eval_iters)
            print(f"step {iter_num}: train loss {last['train']:.4f}, val loss {last['val']:.4f}",
                  flush=True)
        # nanoGPT takes one more step here and then stops; it changes nothing reported.
        if iter_num >= a.max_iters:
            break
        _, loss = model(x, y)
        x, y = get_batch("train")
        loss.backward()
        if a.grad_clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t1 = time.time()
        dt, t0 = t1 - t0, t1
        if iter_num % a.log_interval == 0:
            print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms", flush=True)
        iter_num += 1
    train_s = time.time() - start

    summary = (f"RESULT seed {a.seed} bias {a.bias} gelu {a.gelu}: "
               f"iter {iter_num} val {last['val']:.4f} train {last['train']:.4f} "
               f"({a.eval_iters} batches)")
    if a.final_eval_iters > 0:
        final = estimate_loss(a.final_eval_iters)
        summary += (f"; val {final['val']:.4f} train {final['train']:.4f} "
                    f"({a.final_eval_iters} batches)")
    summary += f"; train+eval wall {train_s:.1f}s, total {time.time() - start:.1f}s"
    print(summary, flush=True)


if __name__ == "__main__":
    main()
