#!/usr/bin/python3
"""Draws one or several gpt-train runs' metrics into one PNG: training loss (with validation loss as
markers), tokens/s and peak memory per category, against the step.

    scripts/plot_metrics.py runs/quickstart --out quickstart.png
    scripts/plot_metrics.py runs/zero3 runs/ddp --labels zero3,ddp --out compare.png

Each RUN is a run's out_dir (its metrics.jsonl is read) or a metrics.jsonl file. Uses matplotlib from Debian
(python3-matplotlib) with the Agg backend, so no display is needed. Steps a resumed run recorded twice
are kept once (the last record). Non-finite values (written as null) are left out.
"""
import argparse
import json
import os
import sys


def read_metrics(path):
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    rows = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit("%s:%d: not a JSON line: %s" % (path, n, e))
            rows[row["step"]] = row
    if not rows:
        sys.exit("%s: no metrics" % path)
    return [rows[s] for s in sorted(rows)]


def series(rows, key, sub=None):
    xs, ys = [], []
    for r in rows:
        v = r.get(key)
        if sub is not None and isinstance(v, dict):
            v = v.get(sub)
        if v is not None:
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def smooth(ys, window):
    if window <= 1:
        return ys
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run out_dirs or metrics.jsonl files")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--labels", help="comma-separated names for the runs (default: directory names)")
    ap.add_argument("--smooth", type=int, default=1, help="moving average over this many steps (tokens/s)")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is missing: apt-get install python3-matplotlib (and run with /usr/bin/python3)")
    labels = args.labels.split(",") if args.labels else [
        os.path.basename(os.path.normpath(r if os.path.isdir(r) else os.path.dirname(r))) for r in args.runs]
    if len(labels) != len(args.runs):
        sys.exit("--labels names %d runs, %d given" % (len(labels), len(args.runs)))

    fig, ((ax_loss, ax_tok), (ax_mem, ax_comm)) = plt.subplots(2, 2, figsize=(12, 8))
    for run, label in zip(args.runs, labels):
        rows = read_metrics(run)
        line, = ax_loss.plot(*series(rows, "loss"), label=label + " train", linewidth=1)
        vx, vy = series(rows, "val_loss")
        if vx:
            ax_loss.plot(vx, vy, "o--", color=line.get_color(), label=label + " val", markersize=4)
        tx, ty = series(rows, "tokens_per_s")
        ax_tok.plot(tx, smooth(ty, args.smooth), label=label, linewidth=1)
        mx, my = series(rows, "mem_peak_bytes", "total")
        ax_mem.plot(mx, [m / 2**20 for m in my], label=label + " total")
        for cat in ("activations", "optimizer", "params"):
            cx, cy = series(rows, "mem_peak_bytes", cat)
            if cy and max(cy) > 0:
                ax_mem.plot(cx, [m / 2**20 for m in cy], ":", label="%s %s" % (label, cat))
        gx, gy = [], []
        for r in rows:
            comm = r.get("comm") or {}
            gx.append(r["step"])
            gy.append(sum(op.get("bytes", 0) for op in comm.values()) / 2**20)
        ax_comm.plot(gx, gy, label=label)
    ax_loss.set(title="loss", xlabel="step", ylabel="cross-entropy (nats)")
    ax_tok.set(title="throughput", xlabel="step", ylabel="tokens/s")
    ax_mem.set(title="peak memory per rank (tracked allocator)", xlabel="step", ylabel="MiB")
    ax_comm.set(title="communication per rank (cumulative)", xlabel="step", ylabel="MiB sent")
    for ax in (ax_loss, ax_tok, ax_mem, ax_comm):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=90)
    print("wrote %s" % args.out)


if __name__ == "__main__":
    main()
