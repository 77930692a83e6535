#!/usr/bin/env bash
# CPU training throughput of gpt-train against PyTorch (torch 1.13, float32) on the same GPT-2 models,
# batches and thread count, with oneDNN's sgemm rate as the roofline reference.
#
#   scripts/bench/cpu_vs_pytorch.sh            # about 5 minutes on 2 cores
#   ROUNDS=5 THREADS=2 STEPS=30 scripts/bench/cpu_vs_pytorch.sh
#
# Configs: A = nanoGPT's CPU Shakespeare model (4 layers, 4 heads, 128 wide, block 64, batch 12, vocab 65);
#          B = 6 layers, 6 heads, 384 wide, block 256, batch 8, vocab 65.
# Each round runs sgemm_bench, gpt-train and PyTorch one after another (never two at once), alternating which
# trainer goes first; every number reported is the median over rounds of the per-run median over the steps
# after warm-up, so a compile running alongside for part of the time moves it little.
# PyTorch gets its best settings on this machine, measured first: OPENBLAS_CORETYPE (OpenBLAS 0.3.21 does not
# know Zen 4) and OMP_WAIT_POLICY (spinning OpenMP threads compete with OpenBLAS's own threads).
#
# FLOPs/token = 6N + 12*L*H*Q*T (N = parameters without the position embedding, Q = head size, T = block).
# Targets: tokens/s ratio gpt-train/PyTorch >= 1.5 for A and >= 1.2 for B; gpt-train >= 70% of sgemm for B.
#
# Needs Debian's python3-torch and libopenblas0-pthread (checked: a PyTorch on the reference BLAS stops the run).
# Environment: ROUNDS (3), THREADS (2), STEPS (sets both STEPS_A (100) and STEPS_B (20)), WARMUP_A (10),
# WARMUP_B (3), BUILD_DIR (build), DATA (../shared/data/tinyshakespeare.txt), KEEP=1 keeps the temp dir.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
source "$ROOT/scripts/bench/common.sh"
PY=$BENCH_PY
BUILD=${BUILD_DIR:-$ROOT/build}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
STEPS_A=${STEPS_A:-${STEPS:-100}}
STEPS_B=${STEPS_B:-${STEPS:-20}}
WARMUP_A=${WARMUP_A:-10}
WARMUP_B=${WARMUP_B:-3}
DATA=${DATA:-$ROOT/../shared/data/tinyshakespeare.txt}
(( WARMUP_A < STEPS_A && WARMUP_B < STEPS_B )) || { echo "need WARMUP_A < STEPS_A and WARMUP_B < STEPS_B" >&2; exit 2; }

log() { bench_log "$@"; }
START=$(date +%s)

# --- build ----------------------------------------------------------------------------------------------------
[[ -f $BUILD/CMakeCache.txt ]] || cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
if ! cmake --build "$BUILD" -j2 --target gpt-train sgemm_bench >/dev/null; then
  cmake -S "$ROOT" -B "$BUILD" >/dev/null  # a build dir configured before scripts/bench existed
  cmake --build "$BUILD" -j2 --target gpt-train sgemm_bench >/dev/null
fi
GPT=$BUILD/gpt-train
SGEMM=$BUILD/sgemm_bench

# --- data -----------------------------------------------------------------------------------------------------
TMP=$(mktemp -d /tmp/gpt-bench.XXXXXX)
[[ ${KEEP:-0} == 1 ]] && log "keeping $TMP" || trap 'rm -rf "$TMP"' EXIT
bench_prepare "$GPT" "$DATA" "$TMP/data"
mkdir -p "$TMP/runs"
RESULTS=$TMP/results.tsv  # config  what  round  value
: >"$RESULTS"

# name n_layer n_head n_embd block batch vocab steps warmup
CONFIGS=("A 4 4 128 64 12 65 $STEPS_A $WARMUP_A" "B 6 6 384 256 8 65 $STEPS_B $WARMUP_B")

for cfg in "${CONFIGS[@]}"; do
  read -r name L H C T B V S W <<<"$cfg"
  bench_config "$TMP/$name.yaml" "$name" "$TMP/runs/$name" "$TMP/data" "$THREADS" "$L" "$H" "$C" "$T" "$B" "$V" "$S"
done

# --- PyTorch's settings ---------------------------------------------------------------------------------------
bench_torch_env "$THREADS"

# --- one run of each ------------------------------------------------------------------------------------------
run_sgemm() {  # name rows width round
  local g
  g=$("$SGEMM" --threads "$THREADS" --rows "$2" --width "$3" | awk '$1 == "sgemm_gflops" {print $2}')
  printf '%s\tsgemm_gflops\t%s\t%s\n' "$1" "$4" "$g" >>"$RESULTS"
  log "  $1 sgemm        $g GFLOP/s"
}

run_gpt() {  # name steps warmup round
  local out=$TMP/runs/$1-r$4 line
  "$GPT" train --config "$TMP/$1.yaml" --set training.steps="$2" --set training.eval_interval=0 \
    --set training.eval_batches=1 --set run.threads="$THREADS" --set run.out_dir="$out" >"$out.log" 2>&1 ||
    { cat "$out.log" >&2; exit 1; }
  line=$("$PY" - "$out/metrics.jsonl" "$3" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r["step"] > int(sys.argv[2])]
print(statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r["gflops"] for r in rows))
EOF
)
  read -r tok gfl <<<"$line"
  printf '%s\tgpt_tok_s\t%s\t%s\n%s\tgpt_logged_gflops\t%s\t%s\n' "$1" "$4" "$tok" "$1" "$4" "$gfl" >>"$RESULTS"
  log "  $1 gpt-train    ${tok%.*} tokens/s"
}

run_torch() {  # name L H C T B V steps warmup round
  local tok
  tok=$(env "${TORCH_ENV[@]}" "$PY" "$ROOT/scripts/bench/pytorch_gpt.py" --n-layer "$2" --n-head "$3" \
    --n-embd "$4" --block-size "$5" --batch-size "$6" --vocab-size "$7" --steps "$8" --warmup "$9" \
    --threads "$THREADS" --data "$TMP/data/train.bin" |
    "$PY" -c 'import json,sys; print([json.loads(l[7:]) for l in sys.stdin if l.startswith("RESULT ")][-1]["tokens_per_s"])')
  printf '%s\ttorch_tok_s\t%s\t%s\n' "$1" "${10}" "$tok" >>"$RESULTS"
  log "  $1 pytorch      ${tok%.*} tokens/s"
}

for ((r = 1; r <= ROUNDS; ++r)); do
  log "round $r/$ROUNDS"
  for cfg in "${CONFIGS[@]}"; do
    read -r name L H C T B V S W <<<"$cfg"
    run_sgemm "$name" $((B * T)) "$C" "$r"
    if ((r % 2)); then
      run_gpt "$name" "$S" "$W" "$r"
      run_torch "$name" "$L" "$H" "$C" "$T" "$B" "$V" "$S" "$W" "$r"
    else
      run_torch "$name" "$L" "$H" "$C" "$T" "$B" "$V" "$S" "$W" "$r"
      run_gpt "$name" "$S" "$W" "$r"
    fi
  done
done

# --- table ----------------------------------------------------------------------------------------------------
"$PY" - "$RESULTS" "$THREADS" "$ROUNDS" "$CORETYPE" "$WAIT_POLICY" "$(($(date +%s) - START))" "${CONFIGS[@]}" <<'EOF'
import collections, statistics, sys

results, threads, rounds, coretype, wait_policy, elapsed = sys.argv[1:7]
configs = [c.split() for c in sys.argv[7:]]
vals = collections.defaultdict(list)
for line in open(results):
    cfg, what, _, value = line.split("\t")
    vals[cfg, what].append(float(value))
med = lambda cfg, what: statistics.median(vals[cfg, what])
per_round = lambda cfg, what, fmt: " ".join(fmt % v for v in vals[cfg, what])
TARGET_RATIO = {"A": 1.5, "B": 1.2}
TARGET_SGEMM = {"B": 0.70}

print("\nCPU training throughput, gpt-train vs PyTorch: %s threads, %s rounds (median over rounds of the median"
      " over steps after warm-up)" % (threads, rounds))
print("PyTorch settings: OPENBLAS_CORETYPE=%s OMP_WAIT_POLICY=%s" % (coretype, wait_policy))
passed = total = 0
for name, L, H, C, T, B, V, S, W in configs:
    L, H, C, T, B, V = map(int, (L, H, C, T, B, V))
    n = V * C + L * (12 * C * C + 13 * C) + 2 * C
    fpt = 6 * n + 12 * L * H * (C // H) * T
    gpt, torch, sg = med(name, "gpt_tok_s"), med(name, "torch_tok_s"), med(name, "sgemm_gflops")
    print("\nConfig %s: %d layers, %d heads, %d wide, block %d, batch %d, vocab %d; N = %.3fM, %.2f MFLOP/token;"
          " %s steps (%s warm-up)" % (name, L, H, C, T, B, V, n / 1e6, fpt / 1e6, S, W))
    print("  %-22s %10s %9s %8s   %s" % ("", "tokens/s", "GFLOP/s", "% sgemm", "tokens/s per round"))
    for label, tok, key in (("gpt-train", gpt, "gpt_tok_s"), ("PyTorch", torch, "torch_tok_s")):
        g = tok * fpt / 1e9
        print("  %-22s %10.0f %9.1f %7.0f%%   %s" % (label, tok, g, 100 * g / sg, per_round(name, key, "%.0f")))
    print("  %-22s %10s %9.1f %7s    %s" % ("sgemm (oneDNN, M=%d)" % (B * T), "", sg, "100%",
                                           per_round(name, "sgemm_gflops", "%.1f")))
    print("  gpt-train's own GFLOP/s (metrics.jsonl): %.1f" % med(name, "gpt_logged_gflops"))
    checks = [("tokens/s ratio gpt-train / PyTorch", gpt / torch, TARGET_RATIO[name], "%.2fx", 1)]
    if name in TARGET_SGEMM:
        checks.append(("gpt-train GFLOP/s / sgemm", gpt * fpt / 1e9 / sg, TARGET_SGEMM[name], "%.1f%%", 100))
    for what, got, target, fmt, scale in checks:
        ok = got >= target
        passed, total = passed + ok, total + 1
        print("  %-38s %8s   target >= %-6s %s" % (what, fmt % (got * scale), fmt % (target * scale),
                                                    "PASS" if ok else "FAIL"))
print("\n%d/%d targets met; %ss in all" % (passed, total, elapsed))
EOF
