"""Device time per training step by kind of work, gpt-train beside PyTorch, for scripts/bench/gpu_vs_pytorch.sh.

    python3 scripts/bench/by_kind.py GPT_TRAIN_LOG TORCH_LOG STEPS

GPT_TRAIN_LOG: a gpt-train run's log with GPT_TRAIN_CUDA_PROFILE=1 (its "CUDA op time" table: op, total ms,
calls, ...), over STEPS training steps (the trainer leaves its first step and its final evaluation out). TORCH_LOG: pytorch_gpt2.py's output with
--profile-steps STEPS (its 'PROF steps=N total_ms=... calls=... name=...' lines, one per CUDA kernel). Each op or
kernel goes to one kind by its name (gpt-train's op names; cuBLAS/CUTLASS, flash/cuDNN attention, fused AdamW and
Triton kernel names on PyTorch's side), and the table gives ms per step for each and PyTorch's over gpt-train's.
"""

import re
import sys

KINDS = ("GEMMs (with their epilogues)", "attention", "cross-entropy", "optimizer (AdamW, norm, clip)",
         "the rest (LayerNorm, GELU, residual, embedding, casts)")


def ours_kind(op):
    if op.startswith("matmul"):
        return 0
    if op.startswith("attention"):
        return 1
    if op.startswith("crossentropy"):
        return 2
    if op.startswith(("adamw", "sum_squares", "round_to_bf16")):
        return 3
    return 4


def torch_kind(name):
    n = name.lower()
    if n.startswith("triton_"):
        # Inductor's kernels: GEMM templates (max-autotune), or fused element-wise ones named after the ops they
        # came from (a layout copy around SDPA is named after it, yet is not attention).
        if n.startswith("triton_tem_"):
            return 0
        if re.search(r"nll|cross_entropy|log_softmax", n):
            return 2
        return 4
    if re.search(r"flash|fmha|attention|attn|sdpa|cudnn", n):
        return 1
    if re.search(r"gemm|gemv|cutlass|xmma|nvjet|cublas|matmul|_mm_|hopper_|ampere_|sm\d\d_|splitkreduce", n):
        return 0
    if re.search(r"nll|cross_entropy|log_softmax|softmax", n):
        return 2
    if re.search(r"adam|multi_tensor|foreach|lpnorm|l2norm|norm_kernel|clip", n) and "layer_norm" not in n:
        return 3
    return 4


def ours_ms(path):
    """Total ms per kind from gpt-train's per-op table."""
    out = [0.0] * len(KINDS)
    in_table = False
    for line in open(path, errors="replace"):
        if "CUDA op time" in line:
            in_table = True
            continue
        m = re.match(r"(?:.*\] )?\s+([a-z_0-9]+)\s+([0-9.]+)\s+([0-9]+)\s", line)
        if in_table and m and m.group(1) not in ("op", "total"):
            out[ours_kind(m.group(1))] += float(m.group(2))
    return out


def torch_ms(path):
    """Total ms per kind from pytorch_gpt2.py's PROF lines, and whether they end with 'PROF end'; None when there
    are none."""
    out = [0.0] * len(KINDS)
    found = complete = False
    for line in open(path, errors="replace"):
        complete = complete or line.strip() == "PROF end"
        m = re.match(r"PROF steps=\d+ total_ms=([0-9.]+) calls=\d+ name=(.*)", line.strip())
        if m:
            found = True
            out[torch_kind(m.group(2))] += float(m.group(1))
    return (out, complete) if found else None


def torch_largest(path, steps, n=15):
    """PyTorch's n largest kernels: (ms per step, calls per step, name), largest first."""
    rows = []
    for line in open(path, errors="replace"):
        m = re.match(r"PROF steps=\d+ total_ms=([0-9.]+) calls=(\d+) name=(.*)", line.strip())
        if m:
            rows.append((float(m.group(1)) / steps, int(m.group(2)) / steps, m.group(3)))
    return sorted(rows, key=lambda r: -r[0])[:n]


def main():
    ours_log, torch_log, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ours = ours_ms(ours_log)
    prof = torch_ms(torch_log)
    if prof is None or not any(ours):
        why = "no PyTorch kernel profile in its log" if prof is None else "no per-op table in gpt-train's log"
        print(f"  (no by-kind comparison: {why})")
        return
    theirs, complete = prof
    print(f"device time by kind, ms per step ({steps} steps each, after warm-up;"
          " kinds read off op and kernel names, so approximate:"
          " bias and GELU fused into GEMM epilogues count as GEMM on gpt-train's side, Triton's as the rest):")
    if not complete:
        print("  (PyTorch's profile was cut short: its kernel list has no 'PROF end' line; its column is partial)")
    print(f"  {'':<54} {'gpt-train':>10} {'PyTorch':>10} {'PyTorch/gpt-train':>18}")
    for k, name in enumerate(KINDS + ("total",)):
        a = (sum(ours) if name == "total" else ours[k]) / steps
        b = (sum(theirs) if name == "total" else theirs[k]) / steps
        ratio = f"{b / a:.2f}" if a > 0 else "-"
        print(f"  {name:<54} {a:>10.2f} {b:>10.2f} {ratio:>18}")
    # Beside gpt-train's per-op (GEMMs per shape) table: PyTorch's own kernels, for the same comparison per kernel.
    print("PyTorch's largest kernels, ms per step (calls per step), name:")
    for ms, calls, name in torch_largest(torch_log, steps):
        print(f"  {ms:8.3f} ({calls:g})  {name[:120]}")


if __name__ == "__main__":
    main()
