"""PyTorch reference for gpt-train's GPU speed benchmark (issue 5): GPT-2 training throughput, nanoGPT style.

The model is the one gpt-train trains: learned token + position embeddings, pre-LN blocks (LayerNorm with bias,
fused qkv Linear with bias, causal attention through F.scaled_dot_product_attention(is_causal=True), output
projection, 4x MLP with tanh GELU), final LayerNorm, LM head tied to the token embedding, mean cross-entropy.
Init as nanoGPT: normal(0, 0.02) weights (residual projections 0.02/sqrt(2*n_layer)), zero biases.
Training: bf16 autocast (--dtype fp32 turns it off), torch.compile(model) (--no-compile turns it off),
torch.optim.AdamW(fused=True on CUDA, lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on 2-D weights
only), gradient clipping at 1.0, no gradient accumulation (one micro-batch of --batch sequences per step).

Data: random windows of --seq + 1 tokens from an llm.c token shard (256 int32 header: magic 20240520, version 1,
token count; then uint16 tokens), read with numpy (seeded), the same file gpt-train reads. Without --data, random
token ids.

Each step is timed with time.perf_counter() between torch.cuda.synchronize() calls (batch fetch and host->device
copy included, as gpt-train's step time). The first --warmup steps (compilation, autotuning, allocator warm-up)
are left out of the median. Prints one line per step, a summary, and last one line `RESULT {json}` with
tokens_per_s (median over the timed steps), step_ms, params (all, and without the position embedding),
flops_per_token (6N + 12*L*H*Q*T), and peak memory (torch.cuda.max_memory_allocated / max_memory_reserved;
null on CPU).

    python3 scripts/bench/pytorch_gpt2.py --data /tmp/x/train.bin --steps 20 --batch 16 --seq 1024
    /usr/bin/python3 scripts/bench/pytorch_gpt2.py --device cpu --no-compile --n-layer 2 --n-head 2 \
        --n-embd 64 --vocab 512 --seq 64 --batch 4 --steps 6      # smoke test without a GPU

Works with torch 1.13 for the CPU smoke test (no SDPA: a masked-softmax attention; no torch.compile; AdamW's
foreach path), torch >= 2.0 for the real run.
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
HEADER_INTS = 256
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)  # fused q, k, v
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def attn(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if HAVE_SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch < 2.0 (the CPU smoke test only)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = F.softmax(att.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                residual = name.endswith(("c_proj.weight", "mlp_proj.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer) if residual else 0.02)

    def forward(self, idx, targets):
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def open_shard(path):
    """The uint16 tokens of an llm.c shard, memory-mapped, after checking its header."""
    header = np.fromfile(path, dtype=np.int32, count=HEADER_INTS)
    if header.size < 3 or header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        sys.exit(f"{path}: not an llm.c token shard (magic {SHARD_MAGIC}, version {SHARD_VERSION})")
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_INTS * 4, shape=(int(header[2]),))
    return tokens


def make_optimizer(model, args, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        kw["fused"] = True
    try:
        return torch.optim.AdamW(groups, **kw), kw.get("fused", False)
    except (TypeError, RuntimeError):  # a torch without fused AdamW
        kw.pop("fused", None)
        return torch.optim.AdamW(groups, **kw), False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (micro-batch = global batch)")
    ap.add_argument("--seq", type=int, default=1024, help="sequence length T (= block size)")
    ap.add_argument("--data", help="llm.c token shard to draw windows from (default: random ids)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="torch.compile(model) (default on)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast, or plain fp32")
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304, help="vocabulary (GPT-2's 50257 padded to 50304)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 = off")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="after RESULT, this many more steps under torch.profiler (CUDA only): their kernels' device "
                         "time, one 'PROF' line per kernel")
    args = ap.parse_args()
    if not 0 <= args.warmup < args.steps:
        ap.error("need 0 <= --warmup < --steps")
    if args.n_embd % args.n_head:
        ap.error("--n-head must divide --n-embd")

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT; matmuls under autocast are bf16 anyway
        torch.backends.cudnn.allow_tf32 = True
    compile_on = args.compile and hasattr(torch, "compile")
    if args.compile and not compile_on:
        print(f"torch {torch.__version__} has no torch.compile: running eager", flush=True)

    L, H, C, T, B, V = args.n_layer, args.n_head, args.n_embd, args.seq, args.batch, args.vocab
    model = GPT(L, H, C, T, V).to(device)
    n_all = sum(p.numel() for p in model.parameters())
    n = n_all - model.wpe.weight.numel()
    flops_per_token = 6 * n + 12 * L * H * (C // H) * T
    optimizer, fused = make_optimizer(model, args, device)
    step_model = torch.compile(model) if compile_on else model

    rng = np.random.default_rng(args.seed)
    if args.data:
        tokens = open_shard(args.data)
        if len(tokens) < T + 1:
            sys.exit(f"{args.data}: {len(tokens)} tokens, fewer than --seq + 1 = {T + 1}")
        if int(tokens.max()) >= V:
            sys.exit(f"{args.data}: token id {int(tokens.max())} >= --vocab {V}")
    else:
        tokens = None

    def get_batch():
        if tokens is None:
            xy = rng.integers(0, min(V, 50257), size=(B, T + 1), dtype=np.int64)
        else:
            starts = rng.integers(0, len(tokens) - T, size=B)
            xy = np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64)
        xy = torch.from_numpy(xy)
        if cuda:
            xy = xy.pin_memory().to(device, non_blocking=True)
        return xy[:, :-1].contiguous(), xy[:, 1:].contiguous()

    if args.dtype == "bf16":
        autocast = lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)  # noqa: E731
    else:
        autocast = contextlib.nullcontext
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name(device) if cuda else 'cpu'}: "
          f"{L} layers, {H} heads, {C} wide, T {T}, batch {B}, vocab {V}; {n_all / 1e6:.2f}M params "
          f"({n / 1e6:.2f}M without wpe); {args.dtype}{' autocast' if args.dtype == 'bf16' else ''}, "
          f"compile {'on' if compile_on else 'off'}, AdamW fused={fused}, SDPA={HAVE_SDPA}", flush=True)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []

    def train_step():
        x, y = get_batch()
        with autocast():
            loss = step_model(x, y)
        loss.backward()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    compile_error = None
    for step in range(1, args.steps + 1):
        sync()
        t0 = time.perf_counter()
        try:
            loss = train_step()
        except Exception as e:  # noqa: BLE001 -- a failed compile (no C compiler, headers, libcuda) runs eager
            if step != 1 or not compile_on:
                raise
            compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            print(f"torch.compile failed at step 1 ({compile_error}): running eager; RESULT says compile false",
                  flush=True)
            torch._dynamo.reset()
            step_model, compile_on = model, False
            optimizer.zero_grad(set_to_none=True)
            sync()
            t0 = time.perf_counter()
            loss = train_step()
        sync()
        dt = time.perf_counter() - t0
        times.append(dt)
        losses.append(loss.item())
        print(f"step {step}/{args.steps}: loss {losses[-1]:.4f}, {dt * 1e3:.1f} ms, {B * T / dt:.0f} tok/s"
              f"{' (warm-up)' if step <= args.warmup else ''}", flush=True)

    timed = times[args.warmup:]
    step_s = statistics.median(timed)
    result = {
        "tokens_per_s": B * T / step_s,
        "step_ms": step_s * 1e3,
        "step_ms_min": min(timed) * 1e3,
        "step_ms_max": max(timed) * 1e3,
        "warmup_s": sum(times[:args.warmup]),
        "params": n_all,
        "params_no_wpe": n,
        "flops_per_token": flops_per_token,
        "final_loss": losses[-1],
        "max_memory_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
        "max_memory_reserved": torch.cuda.max_memory_reserved(device) if cuda else None,
        "torch": torch.__version__,
        "compile": compile_on,
        "compile_error": compile_error,
        "fused_adamw": fused,
        "sdpa": HAVE_SDPA,
        "dtype": args.dtype,
    }
    print(f"median over steps {args.warmup + 1}..{args.steps}: {result['tokens_per_s']:.0f} tokens/s, "
          f"{step_s * 1e3:.1f} ms/step, {flops_per_token * result['tokens_per_s'] / 1e12:.1f} TFLOP/s", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    if args.profile_steps > 0 and cuda:
        profile_kernels(train_step, args.profile_steps)


def profile_kernels(train_step, steps):
    """Runs one warm-up step (CUPTI may drop kernels as a session starts) and `steps` more training steps under
    torch.profiler, and prints each CUDA kernel's device time over those steps, largest first:
    'PROF steps=N total_ms=... calls=... name=...' (the name last: it may hold spaces), then 'PROF end'."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, schedule

    torch.cuda.synchronize()
    when = schedule(wait=0, warmup=1, active=steps, repeat=1)
    with profile(activities=[ProfilerActivity.CUDA], schedule=when) as prof:
        for _ in range(steps + 1):
            train_step()
            torch.cuda.synchronize()
            prof.step()
    rows = []
    for e in prof.key_averages():
        if getattr(e, "device_type", DeviceType.CUDA) != DeviceType.CUDA or getattr(e, "is_user_annotation", False):
            continue  # a host-side row or an annotation spanning kernels (none with the CUDA activity alone)
        # torch >= 2.4 names a kernel's own time device time, older torch cuda time.
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0)
        if us > 0:
            rows.append((us / 1e3, e.count, e.key))
    rows.sort(reverse=True)
    for ms, calls, name in rows:
        print(f"PROF steps={steps} total_ms={ms:.3f} calls={calls} name={' '.join(name.split())[:160]}", flush=True)
    print("PROF end", flush=True)


if __name__ == "__main__":
    main()
