"""PyTorch reference for gpt-train's attention benchmark (scripts/bench/attention_vs_pytorch.sh): causal
F.scaled_dot_product_attention forward and backward at one GPT shape, per SDPA backend, timed as
scripts/bench/attention_bench times gpt-train's kernels.

Inputs as a nanoGPT block makes them: one (B, T, 3C) tensor from the qkv Linear, split into q, k, v and viewed as
(B, NH, T, hs), strided, not copied. q, k and v are leaves, so the backward is SDPA's own (no accumulation into the
qkv tensor); the output gradient is in the input dtype, laid out (B, T, NH, hs) as the output projection's backward
gives it.

Times: CUDA events around --iters calls after --warmup ones (wall time with synchronize on the CPU), divided by
iters. forward: SDPA with autograd recording (as in training, so the backend saves its log-sum-exp); backward:
the time of forward + torch.autograd.grad, less the forward's. FLOPs as FlashAttention's benchmarks count them:
forward 4*B*NH*T^2*hs/2 (causal), backward 2.5 times that.

Prints one line per backend, "pytorch_attention backend=NAME fwd_ms=... bwd_ms=... fwd_tflops=... bwd_tflops=...",
or "pytorch_attention backend=NAME unavailable: WHY" (a backend that refuses the shape or dtype). `default` is
SDPA's own choice, what torch.compile'd nanoGPT runs.

    python3 scripts/bench/pytorch_attention.py --batch 16 --seq 1024 --embd 768 --heads 12
    /usr/bin/python3 scripts/bench/pytorch_attention.py --device cpu --dtype fp32 --batch 2 --seq 64 --embd 64 \
        --heads 2 --backends default          # smoke test without a GPU (torch 1.13: a masked-softmax fallback)
"""

import argparse
import contextlib
import sys
import time

import torch
import torch.nn.functional as F

HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def backend_context(name):
    """A context that restricts SDPA to one backend; the null context for `default`."""
    if name == "default":
        return contextlib.nullcontext()
    try:  # torch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel

        table = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                 "math": "MATH"}
        return sdpa_kernel(getattr(SDPBackend, table[name]))
    except ImportError:  # torch 2.0-2.2
        flags = {"enable_flash": name == "flash", "enable_mem_efficient": name == "efficient",
                 "enable_math": name == "math"}
        if name == "cudnn":
            raise RuntimeError("this torch has no cuDNN SDPA backend")
        return torch.backends.cuda.sdp_kernel(**flags)


def attention(q, k, v):
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]  # torch 1.13 (the CPU smoke test): the math, masked softmax
    s = (q @ k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def timed_ms(device, warmup, iters, fn):
    """(ms per call between CUDA events around `iters` queued calls, whether the host was the bottleneck). Events
    time the slower of the GPU and of Python queueing the calls: when queueing took about as long (>= 90%), the GPU
    waited for Python and the kernels themselves take less than the time given (on the CPU: wall time, False)."""
    for _ in range(warmup):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        host_ms = (time.perf_counter() - t0) * 1e3
        stop.record()
        stop.synchronize()
        gpu_ms = start.elapsed_time(stop)
        return gpu_ms / iters, host_ms >= 0.9 * gpu_ms
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) * 1e3 / iters, False


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backends", default="default,flash,cudnn,efficient",
                   help="comma-separated: default, flash, efficient, cudnn, math")
    a = p.parse_args()
    if a.embd % a.heads != 0 or min(a.batch, a.seq, a.heads, a.iters) < 1 or a.warmup < 0:
        sys.exit("pytorch_attention: expected batch, seq, heads, iters >= 1, warmup >= 0, embd a multiple of heads")
    B, T, C, NH = a.batch, a.seq, a.embd, a.heads
    hs = C // NH
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(1234)
    qkv = torch.randn(B, T, 3 * C, generator=gen).to(device=a.device, dtype=dtype)
    # The output gradient in the layout training hands SDPA: (B, T, NH, hs) memory, viewed as (B, NH, T, hs).
    dy = torch.randn(B, T, NH, hs, generator=gen).to(device=a.device, dtype=dtype).transpose(1, 2)
    q, k, v = (x.view(B, T, NH, hs).transpose(1, 2).detach().requires_grad_() for x in qkv.split(C, dim=2))

    fwd_flops = 4.0 * B * NH * T * T * hs / 2.0
    bwd_flops = 2.5 * fwd_flops
    print(f"pytorch_attention torch={torch.__version__} device={a.device} dtype={a.dtype} B={B} T={T} C={C} "
          f"NH={NH} hs={hs} iters={a.iters}", flush=True)
    for name in a.backends.split(","):
        if not HAVE_SDPA and name != "default":
            print(f"pytorch_attention backend={name} unavailable: this torch has no scaled_dot_product_attention")
            continue
        try:
            with backend_context(name):
                fwd_ms, fwd_host = timed_ms(a.device, a.warmup, a.iters, lambda: attention(q, k, v))
                both_ms, both_host = timed_ms(a.device, a.warmup, a.iters,
                                              lambda: torch.autograd.grad(attention(q, k, v), (q, k, v), dy))
        except Exception as e:  # a backend that cannot take this shape, dtype or device says so and is skipped
            why = " ".join(str(e).split())[:160]
            print(f"pytorch_attention backend={name} unavailable: {type(e).__name__}: {why}", flush=True)
            continue
        bwd_ms = max(both_ms - fwd_ms, 1e-9)
        print(f"pytorch_attention backend={name} fwd_ms={fwd_ms:.4f} bwd_ms={bwd_ms:.4f} "
              f"fwd_tflops={fwd_flops / fwd_ms * 1e-9:.1f} bwd_tflops={bwd_flops / bwd_ms * 1e-9:.1f} "
              f"host_bound={int(fwd_host or both_host)}", flush=True)


if __name__ == "__main__":
    main()
