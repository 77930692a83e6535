#!/usr/bin/env bash
# gpt-train's data-parallel strategies side by side on CPU, against PyTorch DDP (torch 1.13, gloo) on the same
# model and global batch: tokens/s and peak memory per rank.
#
#   scripts/bench/strategies.sh            # about 5 minutes on 2 cores
#   ROUNDS=3 STEPS=30 scripts/bench/strategies.sh
#
# Model: config B of cpu_vs_pytorch.sh (6 layers, 6 heads, 384 wide, block 256, vocab 65), global batch
# NP x MICRO = 8 sequences: NP = 2 ranks under mpirun (OpenMPI's default binding: one core each), MICRO = 4
# sequences per rank, 1 thread per rank. gpt-train runs ddp, zero1, zero2, zero3 with parallel.prefetch 0 and 1;
# PyTorch runs DistributedDataParallel in NP processes (pytorch_gpt.py --ddp: gloo over loopback, 1 thread
# each, with the OPENBLAS_CORETYPE / OMP_WAIT_POLICY that cpu_vs_pytorch.sh's probe picks, measured here at
# 1 thread). Each round runs every variant once, one at a time, starting one further down the list each round;
# tokens/s is the median over rounds of the per-run median over the steps after warm-up.
#
# Memory, rank 0: gpt-train's own peak bytes per category from metrics.jsonl (total, and the model state:
# params + master + grads + optimizer); PyTorch has no CPU allocator statistics, so its total is max RSS and
# its model state the bytes of its parameter, gradient (= DDP bucket views) and AdamW state tensors. Max RSS
# (/usr/bin/time for gpt-train, getrusage for PyTorch) is shown for both.
#
# Targets: gpt-train ddp >= 0.9x PyTorch DDP's tokens/s; zero3 with prefetch 1 >= 0.9x gpt-train ddp's.
#
# Environment: ROUNDS (2), STEPS (20), WARMUP (3), NP (2), MICRO (4), BUILD_DIR (build),
# DATA (../shared/data/tinyshakespeare.txt), KEEP=1 keeps the temp dir.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$ROOT/scripts/bench/common.sh"
BUILD=${BUILD_DIR:-$ROOT/build}
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
NP=${NP:-2}
MICRO=${MICRO:-4}
DATA=${DATA:-$ROOT/../shared/data/tinyshakespeare.txt}
(( WARMUP < STEPS )) || { echo "need WARMUP < STEPS" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "mpirun (OpenMPI) not found" >&2; exit 2; }
START=$(date +%s)

# --- build (only when missing: a rebuild would pick up whatever is being edited; -j1, the machine is shared) ---
GPT=$BUILD/gpt-train
if [[ ! -x $GPT ]]; then
  [[ -f $BUILD/CMakeCache.txt ]] || cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" -j1 --target gpt-train >/dev/null
fi
bench_log "gpt-train: $GPT (built $(date -r "$GPT" '+%F %T'))"

# --- data, config, PyTorch's settings -------------------------------------------------------------------------
TMP=$(mktemp -d /tmp/gpt-strategies.XXXXXX)
[[ ${KEEP:-0} == 1 ]] && bench_log "keeping $TMP" || trap 'rm -rf "$TMP"' EXIT
bench_prepare "$GPT" "$DATA" "$TMP/data"
mkdir -p "$TMP/runs"
MODEL=(6 6 384 256)  # n_layer n_head n_embd block
bench_config "$TMP/B.yaml" strategies "$TMP/runs/B" "$TMP/data" 1 "${MODEL[@]}" "$MICRO" 65 "$STEPS" $((NP * MICRO))
RESULTS=$TMP/results.jsonl
: >"$RESULTS"
bench_torch_env 1

# --- one run of each ------------------------------------------------------------------------------------------
# name strategy prefetch ("-" = the strategy has none); "torch" = PyTorch DDP
VARIANTS=("ddp ddp -" "zero1 zero1 -" "zero2 zero2 -" "zero3-p0 zero3 0" "zero3-p1 zero3 1" "torch - -")
RSS=(); [[ -x /usr/bin/time ]] && RSS=(sh -c 'exec /usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"')

run_gpt() {  # name strategy prefetch round
  local out=$TMP/runs/$1-r$4 sets=(--set parallel.strategy="$2") m rss=null
  [[ $3 != - ]] && sets+=(--set parallel.prefetch="$3")
  env OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -np "$NP" --oversubscribe ${RSS[@]+"${RSS[@]}" "$out.maxrss_kib"} "$GPT" train --config "$TMP/B.yaml" \
    --set run.threads=1 --set run.out_dir="$out" "${sets[@]}" >"$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }
  m=$(bench_metrics "$out/metrics.jsonl" "$WARMUP")
  [[ -s $out.maxrss_kib.0 ]] && rss=$(($(tail -1 "$out.maxrss_kib.0") * 1024))
  echo "{\"name\": \"$1\", \"round\": $4, \"max_rss\": $rss, \"gpt\": $m}" >>"$RESULTS"
  bench_log "  $1: $("$BENCH_PY" -c 'import json,sys; print("%.0f" % json.loads(sys.argv[1])["tokens_per_s"])' "$m") tokens/s"
}

run_torch() {  # round
  local out=$TMP/runs/torch-r$1 res
  env "${TORCH_ENV[@]}" "$BENCH_PY" "$BENCH_TORCH" --ddp "$NP" --threads 1 --n-layer "${MODEL[0]}" \
    --n-head "${MODEL[1]}" --n-embd "${MODEL[2]}" --block-size "${MODEL[3]}" --batch-size "$MICRO" --vocab-size 65 \
    --steps "$STEPS" --warmup "$WARMUP" --data "$TMP/data/train.bin" >"$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }
  res=$(sed -n 's/^RESULT //p' "$out.log" | tail -1)
  echo "{\"name\": \"torch\", \"round\": $1, \"torch\": $res}" >>"$RESULTS"
  bench_log "  torch: $("$BENCH_PY" -c 'import json,sys; print("%.0f" % json.loads(sys.argv[1])["tokens_per_s"])' "$res") tokens/s"
}

for ((r = 1; r <= ROUNDS; ++r)); do
  bench_log "round $r/$ROUNDS"
  for ((i = 0; i < ${#VARIANTS[@]}; ++i)); do
    read -r name strategy prefetch <<<"${VARIANTS[(i + r - 1) % ${#VARIANTS[@]}]}"
    if [[ $name == torch ]]; then run_torch "$r"; else run_gpt "$name" "$strategy" "$prefetch" "$r"; fi
  done
done

# --- table ----------------------------------------------------------------------------------------------------
"$BENCH_PY" - "$RESULTS" "$ROUNDS" "$STEPS" "$WARMUP" "$NP" "$MICRO" "$CORETYPE" "$WAIT_POLICY" \
  "$(($(date +%s) - START))" <<'EOF'
import collections, json, statistics, sys

results, rounds, steps, warmup, np_, micro, coretype, wait_policy, elapsed = sys.argv[1:10]
runs = collections.defaultdict(list)
for line in open(results):
    r = json.loads(line)
    runs[r["name"]].append(r)
MiB = lambda b: "%.1f" % (b / 2**20) if b is not None else "-"
LABELS = [("ddp", "gpt-train ddp"), ("zero1", "gpt-train zero1"), ("zero2", "gpt-train zero2"),
          ("zero3-p0", "gpt-train zero3 prefetch 0"), ("zero3-p1", "gpt-train zero3 prefetch 1"),
          ("torch", "PyTorch DDP (gloo)")]

rows = {}
for name, _ in LABELS:
    rs = runs[name]
    if name == "torch":
        tok = [r["torch"]["tokens_per_s"] for r in rs]
        mem = rs[-1]["torch"]["mem_bytes"]
        rss = max(r["torch"]["mem_bytes"]["max_rss"] for r in rs)
        cats = {"params": mem["params"], "master": None, "grads": mem["grads"], "optimizer": mem["optimizer"]}
        total = rss
    else:
        tok = [r["gpt"]["tokens_per_s"] for r in rs]
        peak = collections.Counter()
        for r in rs:
            for k, v in r["gpt"]["mem_peak_bytes"].items():
                peak[k] = max(peak[k], v)
        cats = {k: peak[k] for k in ("params", "master", "grads", "optimizer")}
        total = peak["total"]
        rss_all = [r["max_rss"] for r in rs if r["max_rss"] is not None]
        rss = max(rss_all) if rss_all else None
    rows[name] = dict(tok=statistics.median(tok), per_round=tok, cats=cats, total=total, rss=rss)

ddp, torch = rows["ddp"]["tok"], rows["torch"]["tok"]
print("\nData-parallel strategies on CPU: %s ranks x 1 thread, micro-batch %s per rank, global batch %d x 256 "
      "tokens; %s rounds of %s steps (median over rounds of the median over steps after %s warm-up)"
      % (np_, micro, int(np_) * int(micro), rounds, steps, warmup))
print("PyTorch settings: OPENBLAS_CORETYPE=%s OMP_WAIT_POLICY=%s" % (coretype, wait_policy))
W = "%-27s %9s %7s  %-13s |" + " %8s" * 7
print("\n" + W % ("", "", "", "", "peak MiB", "per rank", "(rank 0)", "", "", "", ""))
print(W % ("", "tokens/s", "vs ddp", "per round", "total", "state", "params", "master", "grads", "optim",
           "max RSS"))
for name, label in LABELS:
    r = rows[name]
    state = sum(v for v in r["cats"].values() if v is not None)
    print(W % (label, "%.0f" % r["tok"], "%.2fx" % (r["tok"] / ddp), " ".join("%.0f" % t for t in r["per_round"]),
               MiB(r["total"]) + ("*" if name == "torch" else ""), MiB(state), MiB(r["cats"]["params"]),
               MiB(r["cats"]["master"]), MiB(r["cats"]["grads"]), MiB(r["cats"]["optimizer"]), MiB(r["rss"])))
print("\ngpt-train: total and categories are its own tracker's peaks (metrics.jsonl); state = params + master +"
      " grads + optimizer.")
print("* PyTorch: total = max RSS (getrusage; %.0f MiB of it is the interpreter and libraries before the model is"
      " built); params, grads (DDP bucket views) and AdamW state = tensor sizes; no separate master copy."
      % (runs["torch"][-1]["torch"]["mem_bytes"]["rss_start"] / 2**20))

checks = [("gpt-train ddp / PyTorch DDP tokens/s", ddp / torch), ("zero3 prefetch 1 / ddp tokens/s",
                                                                   rows["zero3-p1"]["tok"] / ddp)]
print()
for what, got in checks:
    print("  %-40s %6.2fx   target >= 0.90x   %s" % (what, got, "PASS" if got >= 0.9 else "FAIL"))
print("\n%d/2 targets met; %ss in all" % (sum(got >= 0.9 for _, got in checks), elapsed))
EOF
