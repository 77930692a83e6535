"""PyTorch (float32, CPU) training-throughput baseline for gpt-train's GPT-2.

The same model as gpt-train: token + position embedding, pre-LN blocks (fused qkv Linear with bias, causal
attention written by hand with a masked softmax, output projection, 4x MLP with tanh GELU), final LayerNorm,
LM head tied to the token embedding, mean cross-entropy; AdamW (weight decay on 2-D weights only, foreach
where available), gradient clipping at 1.0. Trains for --steps steps on fixed batches and prints the median
tokens/s over the steps after --warmup, then one line `RESULT {json}` for scripts to parse.

Run with Debian's interpreter, /usr/bin/python3 (torch 1.13 on the system OpenBLAS). Set OPENBLAS_CORETYPE
(and OMP_WAIT_POLICY) before starting it; `--probe` measures the candidates in subprocesses and prints the best.

`--ddp N` trains the same model data-parallel in N processes (torch.multiprocessing, DistributedDataParallel,
gloo over loopback with a file:// rendezvous, gradient_as_bucket_view): --batch-size is then the micro-batch
per process, tokens/s counts all N, and each step's time is the slowest process's. The RESULT line adds peak
memory per process: max RSS (getrusage) and the model-state tensors' bytes (params, grads, AdamW state).
"""

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd)

    def attn(self, x, mask):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(mask[:T, :T], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)

    def forward(self, x, mask):
        x = x + self.attn(self.ln_1(x), mask)
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        # True above the diagonal: the future positions each query may not see.
        self.register_buffer("mask", torch.ones(block_size, block_size, dtype=torch.bool).triu(1))
        for name, p in self.named_parameters():  # GPT-2 init
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith(("proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def flops_per_token(n_layer, n_head, n_embd, block_size, vocab_size):
    """6N + 12*L*H*Q*T, N = parameters excluding the position embedding (gpt-train's definition)."""
    C = n_embd
    n = vocab_size * C + n_layer * (12 * C * C + 13 * C) + 2 * C
    return 6 * n + 12 * n_layer * n_head * (C // n_head) * block_size


def load_batches(args, n_batches, gen):
    """n_batches fixed (inputs, targets) pairs: windows of a llm.c-layout shard, or random tokens."""
    B, T = args.batch_size, args.block_size
    if args.data:
        with open(args.data, "rb") as f:
            header = torch.frombuffer(bytearray(f.read(1024)), dtype=torch.int32)
            n_tok = int(header[2])
            tokens = torch.frombuffer(bytearray(f.read(2 * n_tok)), dtype=torch.int16).to(torch.int64) & 0xFFFF
        out = []
        for _ in range(n_batches):
            starts = torch.randint(0, n_tok - T - 1, (B,), generator=gen)
            win = torch.stack([tokens[s:s + T + 1] for s in starts.tolist()])
            out.append((win[:, :-1].contiguous(), win[:, 1:].contiguous()))
        return out
    return [(torch.randint(0, args.vocab_size, (B, T), generator=gen),
             torch.randint(0, args.vocab_size, (B, T), generator=gen)) for _ in range(n_batches)]


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))


def train(args, rank=0, world=1):
    rss_start = _rss_bytes()  # torch imported, nothing built yet
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    gen = torch.Generator().manual_seed(1337 + rank)  # each process its own batches
    model = GPT(args.n_layer, args.n_head, args.n_embd, args.block_size, args.vocab_size)
    net = model
    if world > 1:  # broadcasts rank 0's parameters; all-reduces (averages) gradients in buckets during backward
        # the causal mask is a constant bool buffer, which gloo cannot broadcast
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["mask"])
        net = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt_kwargs = dict(lr=1e-3, betas=(0.9, 0.99), eps=1e-8)
    try:
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], foreach=True, **opt_kwargs)
        impl = "foreach"
    except TypeError:  # older torch without foreach
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                 {"params": no_decay, "weight_decay": 0.0}], **opt_kwargs)
        impl = "for-loop"
    batches = load_batches(args, 16, gen)
    tokens = args.batch_size * args.block_size * world
    fpt = flops_per_token(args.n_layer, args.n_head, args.n_embd, args.block_size, args.vocab_size)

    step_s = []
    loss = None
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        t0 = time.perf_counter()
        loss = net(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step_s.append(time.perf_counter() - t0)
    mem = {"params": _tensor_bytes(model.parameters()),
           "grads": _tensor_bytes(p.grad for p in model.parameters()),  # = DDP's buckets (bucket views)
           "optimizer": _tensor_bytes(t for st in opt.state.values() for t in st.values()),
           "rss_start": rss_start,
           "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB
    if world > 1:  # the slowest process's step times; every process's memory
        t = torch.tensor(step_s, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step_s = t.tolist()
        mems = [None] * world
        dist.all_gather_object(mems, mem)
        mem = dict(mems[0], max_rss_all=[m["max_rss"] for m in mems])
        if rank != 0:
            return
    timed = step_s[args.warmup:] or step_s
    tok_s = statistics.median(tokens / s for s in timed)
    n_params = sum(p.numel() for p in model.parameters())
    print("pytorch %s: %d layers, %d heads, %d wide, block %d, vocab %d, %.2fM params, batch %d%s, %d threads, "
          "AdamW %s, OPENBLAS_CORETYPE=%s" % (torch.__version__, args.n_layer, args.n_head, args.n_embd,
                                               args.block_size, args.vocab_size, n_params / 1e6, args.batch_size,
                                               " x %d DDP (gloo) processes" % world if world > 1 else "",
                                               torch.get_num_threads(), impl,
                                               os.environ.get("OPENBLAS_CORETYPE", "(default)")))
    print("steps %d (warmup %d), final loss %.4f, median %.1f ms/step, %.0f tokens/s, %.1f GFLOP/s"
          % (args.steps, args.warmup, loss.item(), 1e3 * tokens / tok_s, tok_s, tok_s * fpt / 1e9))
    print("peak memory (rank 0): max RSS %.1f MiB (%.1f MiB at start), params %.1f MiB, grads %.1f MiB, "
          "AdamW state %.1f MiB" % tuple(mem[k] / 2**20 for k in ("max_rss", "rss_start", "params", "grads",
                                                                   "optimizer")))
    print("RESULT " + json.dumps({"tokens_per_s": tok_s, "gflops": tok_s * fpt / 1e9,
                                  "step_ms": [round(1e3 * s, 3) for s in step_s], "mem_bytes": mem}), flush=True)


def _ddp_worker(rank, args, store):
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=args.ddp)
    try:
        train(args, rank, args.ddp)
    finally:
        dist.destroy_process_group()


def train_ddp(args):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only
    with tempfile.TemporaryDirectory(prefix="pytorch-ddp-") as d:
        mp.spawn(_ddp_worker, args=(args, os.path.join(d, "store")), nprocs=args.ddp, join=True)


# --- OPENBLAS_CORETYPE probe ----------------------------------------------------------------------------------
PROBE_CODE = r"""
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
shapes = [(768, 128, 512), (768, 512, 128), (2048, 384, 1152), (2048, 1536, 384), (2048, 384, 1536)]
mats = [(torch.randn(m, k), torch.randn(k, n)) for m, n, k in shapes]
for a, b in mats: a @ b
total = 0.0
for (m, n, k), (a, b) in zip(shapes, mats):
    reps, best = 0, 0.0
    for _ in range(3):
        t0 = time.perf_counter(); reps = 0
        while time.perf_counter() - t0 < 0.04: torch.mm(a, b); reps += 1
        best = max(best, 2.0 * m * n * k * reps / (time.perf_counter() - t0) / 1e9)
    total += 1.0 / best  # harmonic mean: time to run one of each
print(len(shapes) / total)
"""


def _probe_env(threads, coretype, wait_policy):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    for key, value in (("OPENBLAS_CORETYPE", coretype), ("OMP_WAIT_POLICY", wait_policy)):
        env.pop(key, None)
        if value:
            env[key] = value
    return env


def probe(args):
    """Picks PyTorch's best runtime settings on this machine and prints them as `coretype X` and
    `wait_policy Y` ('default' = leave unset); the measurements go to stderr.

    OPENBLAS_CORETYPE: torch.mm GFLOP/s per candidate, each in its own process ('' = OpenBLAS's detection),
    best of two passes.
    OMP_WAIT_POLICY: tokens/s of a short training run of the model in args, default vs passive. torch's
    OpenMP threads and OpenBLAS's own pthreads share the cores, and OpenMP threads that spin while OpenBLAS
    works can slow training down a lot; the mm timing alone does not show it."""
    t = args.threads
    candidates = args.candidates.split(",")
    rates = {c: 0.0 for c in candidates}
    failed = {}  # a core type this CPU lacks the instructions for dies (SIGILL): it is not a candidate here
    for _ in range(2):  # two interleaved passes, best of each: a busy neighbour hurts one pass, not both
        for c in candidates:
            if c in failed:
                continue
            run = subprocess.run([sys.executable, "-c", PROBE_CODE, str(t)], env=_probe_env(t, c, ""),
                                 capture_output=True, text=True)
            if run.returncode != 0:
                failed[c] = run.returncode
                continue
            rates[c] = max(rates[c], float(run.stdout.split()[-1]))
    for c in candidates:
        if c in failed:
            print("  OPENBLAS_CORETYPE=%-10s exit %d (not for this CPU)" % (c or "(default)", failed[c]),
                  file=sys.stderr)
        else:
            print("  OPENBLAS_CORETYPE=%-10s torch.mm %6.1f GFLOP/s" % (c or "(default)", rates[c]), file=sys.stderr)
    usable = [c for c in candidates if c not in failed]
    if not usable:
        sys.exit("probe: torch.mm failed under every OPENBLAS_CORETYPE candidate")
    coretype = max(usable, key=lambda c: rates[c])

    cmd = [sys.executable, os.path.abspath(__file__), "--threads", str(t), "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "vocab_size"):
        cmd += ["--" + k.replace("_", "-"), str(getattr(args, k))]
    tok_s = {}
    for w in ("", "passive"):
        out = subprocess.run(cmd, env=_probe_env(t, coretype, w), check=True, capture_output=True,
                             text=True).stdout
        tok_s[w] = json.loads(out.splitlines()[-1][len("RESULT "):])["tokens_per_s"]
        print("  OMP_WAIT_POLICY=%-10s training %8.0f tokens/s" % (w or "(default)", tok_s[w]), file=sys.stderr)
    wait_policy = max(tok_s, key=lambda w: tok_s[w])
    print("coretype %s" % (coretype or "default"))
    print("wait_policy %s" % (wait_policy or "default"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=12)
    p.add_argument("--vocab-size", type=int, default=65)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default="", help="llm.c-layout token shard (default: random tokens)")
    p.add_argument("--ddp", type=int, default=0, metavar="N",
                   help="train in N DistributedDataParallel processes (gloo, loopback); --batch-size per process")
    p.add_argument("--probe", action="store_true",
                   help="pick OPENBLAS_CORETYPE (torch.mm timing) and OMP_WAIT_POLICY (a short training run of "
                        "this model for --steps steps) and print them")
    p.add_argument("--candidates", default=",SkylakeX,Haswell,Zen",
                   help="comma-separated OPENBLAS_CORETYPE values for --probe ('' = OpenBLAS's detection)")
    args = p.parse_args()
    if args.probe:
        probe(args)
    elif args.ddp > 1:
        train_ddp(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
