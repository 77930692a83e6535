#!/usr/bin/env bash
# GPU training throughput of gpt-train against PyTorch (issue 5, section Speed): GPT-2 124M shape (12 layers,
# 12 heads, 768 wide, T = 1024, vocab 50257 padded to 50304), one GPU, same micro-batch, same data, same steps.
#
#   scripts/bench/gpu_vs_pytorch.sh                                   # on the GPU machine, from the repo root
#   GPT_TRAIN=build-gpu/gpt-train MICRO_BATCH=16 STEPS=30 scripts/bench/gpu_vs_pytorch.sh
#   GPT_TRAIN_CUDA_PROFILE=1 scripts/bench/gpu_vs_pytorch.sh         # + gpt-train's per-op CUDA time table
#   DEVICE=cpu PYTHON=/usr/bin/python3 N_LAYER=2 N_HEAD=2 N_EMBD=64 SEQ=64 VOCAB=512 MICRO_BATCH=4 \
#     STEPS=6 TOKENS=200000 scripts/bench/gpu_vs_pytorch.sh                        # pipeline smoke test, no GPU
#
# What runs, one after the other (never both at once):
#   1. a synthetic token shard in llm.c's layout (256 int32 header: magic 20240520, version 1, count; then
#      uint16 ids), uniform random ids < min(50257, VOCAB) from a seeded numpy generator: train.bin (TOKENS)
#      and val.bin (enough for one eval batch);
#   2. gpt-train: a YAML written here (run.device DEVICE, parallel.strategy single, parallel.param_dtype
#      PARAM_DTYPE (below), dropout 0, micro-batch = global batch = MICRO_BATCH, AdamW lr 6e-4 constant,
#      betas (0.9, 0.95), wd 0.1, clip 1.0, no checkpoints, evaluation only the one at the end that gpt-train
#      always does, 1 eval batch), under `timeout`;
#      tokens/s = median of metrics.jsonl's tokens_per_s over the steps after WARMUP; peak memory = the
#      tracked allocator's total (summary.json mem_peak_bytes.total: every Buffer by category, device buffers
#      included through Buffer::adopt; not the CUDA context or library workspaces it does not allocate);
#   3. scripts/bench/pytorch_gpt2.py: the same model nanoGPT-style (SDPA is_causal, bf16 autocast,
#      torch.compile, fused AdamW with the same hyper-parameters), the same shard, batch and steps, under
#      `timeout`; median tokens/s after WARMUP and torch.cuda.max_memory_allocated().
# With nvidia-smi present, the device's memory.used is also sampled every 200 ms during each side (peak minus
# the idle reading before it), the same yardstick for both (it counts PyTorch's cached blocks and both CUDA
# contexts). A side that fails or times out prints its log's last lines and shows as "failed" in the table.
# The table is printed next; then the per-op profile (PROFILE_STEPS) and each variant (VARIANTS) of the gpt-train
# run, one line each, after the table so that a run cut short by a caller's time limit loses only its own lines.
#
# FLOPs/token = 6N + 12*L*H*Q*T (N = parameters without the position embedding, L layers, H heads, Q head
# size, T sequence length); MFU = tokens/s * FLOPs/token / peak, peak = PEAK_TFLOPS (default 989: H100/H200
# SXM dense bf16 tensor-core peak).
# Targets (issue 5): gpt-train/PyTorch tokens/s >= 1.0 and gpt-train MFU >= 50%.
#
# Environment (defaults): GPT_TRAIN (build/gpt-train), PYTHON (python3: the one with torch), DEVICE (cuda),
# MICRO_BATCH (64: llm.c's micro-batch for GPT-2 124M; 26 GiB on gpt-train's side, where 16 took 8 of an H200's
# 141: "to fill memory sensibly", issue 5), STEPS (40: at batch 64 single steps spread over 43-48% MFU, and the variants
# differ by about 1%), WARMUP (3), N_LAYER (12), N_HEAD (12), N_EMBD (768), SEQ (1024),
# VOCAB (50304), TOKENS (4000000), PEAK_TFLOPS (989), COMPILE (1; 0 = PyTorch eager), TORCH_DTYPE (bf16),
# GPT_TIMEOUT (60 s), TORCH_TIMEOUT (150 s: a cold torch.compile), THREADS (0 = all cores; gpt-train's
# run.threads and PyTorch's),
# PARAM_DTYPE (auto: bf16 on cuda when this binary's parallel.param_dtype also makes the GEMMs bf16, else fp32),
# GPT_TRAIN_SET (extra "key=value" overrides for gpt-train, space-separated), VARIANTS (more gpt-train runs after the
# table, ";"-separated, each a space-separated list of overrides on top of GPT_TRAIN_SET, e.g. "run.gelu_fusion=full",
# where a word with an upper-case name (GPT_ATTENTION_FWD_ROWS=32) is put in that run's environment instead;
# default, when the run is bf16 on cuda: kernels/cuda's switches, the least known first (the attention's tiles head by
# head as before their order by length, GPT_ATTENTION_ORDER=head; the dK/dV kernel's dS^T
# stored from its fragments as before it was staged, GPT_ATTENTION_WGMMA_DS_STAGE=0; the qkv bias gradient by
# bias_backward as before the wgmma backward summed it, GPT_ATTENTION_WGMMA_BIAS=0; the weight gradients on their own
# stream, GPT_GEMM_WGRAD_STREAM=1; the fc bias gradient from the DGELU GEMM's epilogue, GPT_GEMM_DGELU_BGRAD=1; the
# warp-specialised dK/dV kernel at 128 queries per step, GPT_ATTENTION_WGMMA_BQ=128, overlapped; the
# warp-specialised kernels, GPT_ATTENTION_WGMMA_WS=2, =3, _WS_KV=2, =3, overlapped;
# the tiles every product of a block multiplies held in registers, GPT_ATTENTION_WGMMA_RS=1; the wgmma dK/dV kernel at 64 queries per step, GPT_ATTENTION_WGMMA_BQ=64;
# the kernels with their element-wise work
# overlapping their products, GPT_ATTENTION_WGMMA_OVERLAP=1; blocks of two warpgroups, GPT_ATTENTION_WGMMA_WG2=1;
# cuBLASLt's algorithms timed into a file, GPT_GEMM_ALGOS=8 GPT_GEMM_ALGO_CACHE=FILE, then read from it; the
# forward on key tiles of 128, GPT_ATTENTION_WGMMA_BK=128; the cross-entropy with its rows in shared memory,
# GPT_CE_ROW_IN_SMEM=1; 64 queries with the overlap, with two warpgroups; attention_vs_pytorch.sh times the attention
# ones kernel by kernel), then the mma.sync attention
# kernels where sm_90 takes the wgmma ones (GPT_ATTENTION_WGMMA=0), and, where this binary has the key,
# run.gelu_fusion=none and =forward (the base run has auto: full); "" = none),
# VARIANT_TIMEOUT (60 s each), TIME_LIMIT (0; else seconds from the start: each side's timeout is cut to what is
# left of it less 15 s for the table, and the profile run and each variant start only if their timeout still fits,
# else say they were skipped), PROFILE_STEPS (on cuda 4, else 0 = none: after the table, a run of one step more under
# GPT_TRAIN_CUDA_PROFILE=1, which times the steps after its first, whose per-op device time table (GEMMs by shape) is
# printed, the per-kernel breakdown of a step; 60 s at
# most; and PyTorch runs as many more steps under torch.profiler after its RESULT line, so that scripts/bench/by_kind.py
# prints both sides' device time per step by kind: GEMMs, attention, cross-entropy, optimizer, the rest),
# GPT_TRAIN_CUDA_PROFILE (passed
# through; when 1 the whole gpt-train log, with its per-op table, is printed), KEEP=1 keeps the temp dir.
# GPT_GEMM_ALGOS=N, GPT_GEMM_ALGO_CACHE=FILE, GPT_GEMM_DGELU_BGRAD=1,
# GPT_GEMM_WGRAD_STREAM=1, GPT_ATTENTION_FWD_ROWS=32, GPT_ATTENTION_BWD_BLOCKS=2, GPT_ATTENTION_DQ=recompute, GPT_ATTENTION_ORDER=head and
# GPT_ATTENTION_WGMMA* (the CUDA switches in kernels/cuda/switches.h) pass through to gpt-train too; under
# GPT_GEMM_ALGOS its per-shape timings are printed after its log's last lines.
# Budget: under 4 minutes on one H200 with the defaults before the variants (the two timeouts sum to 210 s), each
# variant at most VARIANT_TIMEOUT more. Exit status: 0; 1 when a side failed or timed out (after all the output);
# 2 for a bad setting.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
GPT_TRAIN=${GPT_TRAIN:-build/gpt-train}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MICRO_BATCH=${MICRO_BATCH:-64}
STEPS=${STEPS:-40}
WARMUP=${WARMUP:-3}
N_LAYER=${N_LAYER:-12}
N_HEAD=${N_HEAD:-12}
N_EMBD=${N_EMBD:-768}
SEQ=${SEQ:-1024}
VOCAB=${VOCAB:-50304}
TOKENS=${TOKENS:-4000000}
PEAK_TFLOPS=${PEAK_TFLOPS:-989}
COMPILE=${COMPILE:-1}
TORCH_DTYPE=${TORCH_DTYPE:-bf16}
GPT_TIMEOUT=${GPT_TIMEOUT:-60}
TORCH_TIMEOUT=${TORCH_TIMEOUT:-150}
THREADS=${THREADS:-0}
GPT_TRAIN_SET=${GPT_TRAIN_SET:-}
PARAM_DTYPE=${PARAM_DTYPE:-auto}
VARIANT_TIMEOUT=${VARIANT_TIMEOUT:-60}
TIME_LIMIT=${TIME_LIMIT:-0}
PROFILE_STEPS=${PROFILE_STEPS:-$([[ $DEVICE == cuda ]] && echo 4 || echo 0)}
(( WARMUP < STEPS )) || { echo "need WARMUP < STEPS" >&2; exit 2; }
[[ $GPT_TRAIN == /* ]] || GPT_TRAIN=$PWD/$GPT_TRAIN
[[ -x $GPT_TRAIN ]] || { echo "no gpt-train binary at $GPT_TRAIN (set GPT_TRAIN)" >&2; exit 2; }

fits() {  # SECONDS_NEEDED: whether a run of at most that long ends inside TIME_LIMIT
  ((TIME_LIMIT == 0 || $(date +%s) - START + $1 <= TIME_LIMIT))
}
# TIMEOUT: that, or under TIME_LIMIT what is left of it less 15 s for the table (10 s at least), so that a caller's
# own limit does not kill a side (and leave its processes on the GPU) before the table is printed.
capped() {
  local t=$1 left
  if ((TIME_LIMIT > 0)); then
    left=$((TIME_LIMIT - ($(date +%s) - START) - 15))
    ((left < t)) && t=$left
    ((t < 10)) && t=10
  fi
  echo "$t"
}
why() {  # RC TIMEOUT: a failed side's exit status in words
  case $1 in 124 | 137) echo "timed out (limit $2 s, exit status $1)" ;; *) echo "exit status $1" ;; esac
}
log() { echo "[gpu-bench $(date +%H:%M:%S)] $*"; }  # stdout, so the table stays last in a merged log
START=$(date +%s)
TMP=$(mktemp -d /tmp/gpu-bench.XXXXXX)
SMI_PID=""
cleanup() {
  [[ -n $SMI_PID ]] && kill "$SMI_PID" 2>/dev/null || true
  [[ ${KEEP:-0} == 1 ]] || rm -rf "$TMP"
}
trap cleanup EXIT
[[ ${KEEP:-0} == 1 ]] && log "KEEP=1: $TMP stays after the run"

# --- nvidia-smi memory sampling (optional) --------------------------------------------------------------------
HAVE_SMI=0
[[ $DEVICE == cuda ]] && command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >/dev/null 2>&1 && HAVE_SMI=1
smi_start() {  # NAME: idle reading, then sampling in the background
  ((HAVE_SMI)) || return 0
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 >"$TMP/$1.smi_idle" 2>/dev/null || true
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 200 >"$TMP/$1.smi" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {
  [[ -n $SMI_PID ]] || return 0
  kill "$SMI_PID" 2>/dev/null || true
  wait "$SMI_PID" 2>/dev/null || true
  SMI_PID=""
}

# --- data -----------------------------------------------------------------------------------------------------
log "data: $TOKENS random GPT-2-vocab tokens in llm.c shards under $TMP/data"
mkdir -p "$TMP/data"
"$PYTHON" - "$TMP/data" "$TOKENS" "$VOCAB" "$((4 * MICRO_BATCH * SEQ + 1))" <<'EOF'
import sys
import numpy as np
out, n_train, vocab, n_val = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(20240520)
hi = min(50257, vocab)
for name, n in (("train", n_train), ("val", n_val)):
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    with open(f"{out}/{name}.bin", "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, hi, size=n, dtype=np.uint16).tobytes())
EOF

# --- gpt-train ------------------------------------------------------------------------------------------------
# Its precision, read off this binary's config reference: a compute-precision key of its own if one exists,
# and whether parallel.param_dtype bf16 also feeds the GEMMs bf16 on cuda (its meaning then mentions GEMMs).
HELP_CONFIG=$("$GPT_TRAIN" train --help-config 2>/dev/null || true)
PRECISION_KEYS=$(grep -oE '^  (compute_dtype|precision|mixed_precision|amp|autocast|dtype) ' <<<"$HELP_CONFIG" |
  tr -d ' ' | tr '\n' ' ' || true)
PARAM_DTYPE_TEXT=$(grep -A1 '^  param_dtype ' <<<"$HELP_CONFIG" | tail -n 1 | sed 's/^ *//' || true)
if [[ $PARAM_DTYPE == auto ]]; then
  PARAM_DTYPE=fp32
  [[ $DEVICE == cuda ]] && grep -qi gemm <<<"$PARAM_DTYPE_TEXT" && PARAM_DTYPE=bf16
fi
if [[ -z ${VARIANTS+set} ]]; then
  VARIANTS=""
  if [[ $DEVICE == cuda && $PARAM_DTYPE == bf16 ]]; then
    # kernels/cuda's switches (a binary without them runs its defaults again): the wgmma kernels' experiments, the
    # weight gradients on their own stream, the mma.sync attention where sm_90 takes the wgmma one.
    # First the new defaults' own switches (the tiles head by head, the dK/dV kernel's dS^T as the H200 last ran
    # them), then the experiments not yet measured, then BQ=64 (1.012x at batch 64 in session 24): check.sh's time
    # runs the first few.
    VARIANTS="GPT_ATTENTION_ORDER=head;GPT_ATTENTION_WGMMA_DS_STAGE=0;GPT_ATTENTION_WGMMA_BIAS=0"
    VARIANTS="$VARIANTS;GPT_GEMM_WGRAD_STREAM=1;GPT_GEMM_DGELU_BGRAD=1"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_BQ=128;GPT_ATTENTION_WGMMA_BQ=128 GPT_ATTENTION_WGMMA_OVERLAP=bwd"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_WS=2;GPT_ATTENTION_WGMMA_WS=3"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_WS_KV=2"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_WS_KV=3;GPT_ATTENTION_WGMMA_WS_KV=2 GPT_ATTENTION_WGMMA_OVERLAP=bwd"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_RS=1;GPT_ATTENTION_WGMMA_BQ=64"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_OVERLAP=1;GPT_ATTENTION_WGMMA_WG2=1"
    # cuBLASLt's algorithms chosen by timing and kept in a file, then taken from it (the steps timed leave out the
    # first, where the timing runs)
    VARIANTS="$VARIANTS;GPT_GEMM_ALGOS=8 GPT_GEMM_ALGO_CACHE=$TMP/gemm-algos.txt;GPT_GEMM_ALGO_CACHE=$TMP/gemm-algos.txt"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_BK=128;GPT_CE_ROW_IN_SMEM=1"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_BQ=64 GPT_ATTENTION_WGMMA_OVERLAP=1"
    VARIANTS="$VARIANTS;GPT_ATTENTION_WGMMA_BQ=64 GPT_ATTENTION_WGMMA_WG2=1;GPT_ATTENTION_WGMMA=0"
    grep -q '^  gelu_fusion ' <<<"$HELP_CONFIG" &&
      VARIANTS="$VARIANTS;run.gelu_fusion=none;run.gelu_fusion=forward"  # the default: full
  fi
fi
GPT_DIR=$TMP/gpt-run
cat >"$TMP/gpt.yaml" <<EOF
run:
  name: gpu-bench
  out_dir: $GPT_DIR
  seed: 1337
  threads: $THREADS
  device: $DEVICE
model:
  n_layer: $N_LAYER
  n_head: $N_HEAD
  n_embd: $N_EMBD
  block_size: $SEQ
  vocab_size: $VOCAB
  dropout: 0.0
data:
  train: $TMP/data/train.bin
  val: $TMP/data/val.bin
  sampling: random
training:
  steps: $STEPS
  micro_batch_size: $MICRO_BATCH
  global_batch_sequences: $MICRO_BATCH
  lr: 6.0e-4
  min_lr: 6.0e-4
  warmup_steps: 0
  lr_schedule: constant
  beta1: 0.9
  beta2: 0.95
  eps: 1.0e-8
  weight_decay: 0.1
  grad_clip: 1.0
  eval_interval: 0
  eval_batches: 1
  activation_checkpointing: none
parallel:
  strategy: single
  param_dtype: $PARAM_DTYPE
checkpoint:
  every: 0
logging:
  log_interval: 1
EOF
GPT_ARGS=()
for kv in $GPT_TRAIN_SET; do GPT_ARGS+=(--set "$kv"); done


GPT_TIMEOUT=$(capped "$GPT_TIMEOUT")
log "gpt-train: $GPT_TRAIN on $DEVICE, $STEPS steps of $MICRO_BATCH x $SEQ (timeout ${GPT_TIMEOUT}s)"
GPT_RC=0
smi_start gpt
T0=$(date +%s)
timeout -k 5 "$GPT_TIMEOUT" "$GPT_TRAIN" train --config "$TMP/gpt.yaml" "${GPT_ARGS[@]}" >"$TMP/gpt.log" 2>&1 ||
  GPT_RC=$?
GPT_OK=$((GPT_RC == 0))
GPT_WALL=$(($(date +%s) - T0))
smi_stop
if ((GPT_OK)) && [[ ${GPT_TRAIN_CUDA_PROFILE:-0} == 1 ]]; then
  echo "--- gpt-train log ($GPT_WALL s) ---"
  cat "$TMP/gpt.log"
elif ((GPT_OK)); then
  echo "--- gpt-train log, last 8 lines ($GPT_WALL s) ---"
  tail -n 8 "$TMP/gpt.log"
  # GPT_GEMM_ALGOS=N (kernels/cuda/matmul.cu): each GEMM shape's timed algorithms and the one chosen.
  grep -h 'GPT_GEMM_ALGOS:' "$TMP/gpt.log" | sed 's/^.*GPT_GEMM_ALGOS: /  gemm algorithms: /' |
    cut -c1-2000 || true
else
  echo "--- gpt-train FAILED: $(why "$GPT_RC" "$GPT_TIMEOUT") after $GPT_WALL s; last 30 lines of its log ---"
  tail -n 30 "$TMP/gpt.log"
fi

# --- PyTorch --------------------------------------------------------------------------------------------------
TORCH_ARGS=(--steps "$STEPS" --warmup "$WARMUP" --batch "$MICRO_BATCH" --seq "$SEQ" --data "$TMP/data/train.bin"
  --device "$DEVICE" --dtype "$TORCH_DTYPE" --n-layer "$N_LAYER" --n-head "$N_HEAD" --n-embd "$N_EMBD"
  --vocab "$VOCAB" --threads "$THREADS")
[[ $COMPILE == 1 ]] && TORCH_ARGS+=(--compile) || TORCH_ARGS+=(--no-compile)
# Its kernels' device time over PROFILE_STEPS more steps, after its RESULT line (a timeout there loses only them).
((PROFILE_STEPS > 0)) && [[ $DEVICE == cuda ]] && TORCH_ARGS+=(--profile-steps "$PROFILE_STEPS")
TORCH_TIMEOUT=$(capped "$TORCH_TIMEOUT")
log "PyTorch: $PYTHON scripts/bench/pytorch_gpt2.py ${TORCH_ARGS[*]} (timeout ${TORCH_TIMEOUT}s)"
TORCH_RC=0
smi_start torch
T0=$(date +%s)
# TORCH_LOGS: a graph break or a recompile (each would cost PyTorch time) is named in its log.
TORCH_LOGS=${TORCH_LOGS:-recompiles,graph_breaks} timeout -k 5 "$TORCH_TIMEOUT" "$PYTHON" \
  "$ROOT/scripts/bench/pytorch_gpt2.py" "${TORCH_ARGS[@]}" >"$TMP/torch.log" 2>&1 ||
  TORCH_RC=$?
TORCH_OK=$((TORCH_RC == 0))
# With profile steps, a RESULT line is its measurement: a failure after it (in those steps) costs the profile only.
if ((!TORCH_OK)) && [[ " ${TORCH_ARGS[*]} " == *" --profile-steps "* ]] && grep -q '^RESULT ' "$TMP/torch.log"; then
  TORCH_OK=1
  echo "--- PyTorch: $(why "$TORCH_RC" "$TORCH_TIMEOUT") after its RESULT line (in its profile steps); the table keeps its result"
fi
TORCH_WALL=$(($(date +%s) - T0))
smi_stop
if ((TORCH_OK)); then
  echo "--- PyTorch log, last 4 lines ($TORCH_WALL s) ---"
  grep -vE '^(RESULT|PROF) ' "$TMP/torch.log" | tail -n 4
else
  echo "--- PyTorch FAILED: $(why "$TORCH_RC" "$TORCH_TIMEOUT") after $TORCH_WALL s; last 30 lines of its log ---"
  tail -n 30 "$TMP/torch.log"
fi

# --- table ----------------------------------------------------------------------------------------------------
"$PYTHON" - "$TMP" "$GPT_OK" "$TORCH_OK" "$WARMUP" "$STEPS" "$N_LAYER" "$N_HEAD" "$N_EMBD" "$SEQ" "$VOCAB" \
  "$MICRO_BATCH" "$PEAK_TFLOPS" "$DEVICE" "$HAVE_SMI" "$GPT_WALL" "$TORCH_WALL" "$(($(date +%s) - START))" \
  "$PRECISION_KEYS" "$GPT_TRAIN_SET" "$PARAM_DTYPE" "$PARAM_DTYPE_TEXT" <<'EOF'
import json, os, statistics, sys

(tmp, gpt_ok, torch_ok, warmup, steps, L, H, C, T, V, B, peak_tflops, device, have_smi, gpt_wall, torch_wall,
 elapsed, precision_keys, gpt_set, param_dtype, param_dtype_text) = sys.argv[1:]
gpt_ok, torch_ok, have_smi = gpt_ok == "1", torch_ok == "1", have_smi == "1"
warmup, steps, L, H, C, T, V, B = map(int, (warmup, steps, L, H, C, T, V, B))
peak = float(peak_tflops) * 1e12
Q = C // H
N = V * C + L * (12 * C * C + 13 * C) + 2 * C  # wte (tied head) + blocks + ln_f; no wpe
fpt = 6 * N + 12 * L * H * Q * T
notes = []

def smi_peak(name):
    if not have_smi:
        return None
    try:
        idle = float(open(f"{tmp}/{name}.smi_idle").read().split()[0])
        vals = [float(v) for v in open(f"{tmp}/{name}.smi").read().split() if v.replace(".", "").isdigit()]
        return (max(vals) - idle) * 2**20 if vals else None
    except (OSError, ValueError, IndexError):
        return None

gpt = {"tok": None, "mem": None, "run_tok": None}
if gpt_ok:
    try:
        rows = [json.loads(l) for l in open(f"{tmp}/gpt-run/metrics.jsonl") if l.strip()]
        timed = [r for r in rows if r["step"] > warmup]
        gpt["tok"] = statistics.median(r["tokens_per_s"] for r in timed)
        gpt["step_ms"] = statistics.median(r["step_ms"] for r in timed)
        mem = max(r["mem_peak_bytes"]["total"] for r in rows)
        try:
            s = json.load(open(f"{tmp}/gpt-run/summary.json"))
            mem = max(mem, s["mem_peak_bytes"]["total"])
            gpt["run_tok"] = s["tokens_per_s"]
        except (OSError, KeyError, ValueError):
            notes.append("gpt-train wrote no readable summary.json; its peak memory is metrics.jsonl's")
        gpt["mem"] = mem
    except (OSError, KeyError, ValueError, statistics.StatisticsError) as e:
        gpt_ok = False
        notes.append(f"gpt-train's metrics.jsonl could not be read: {e!r}")
gpt["smi"] = smi_peak("gpt")

torch = {"tok": None, "mem": None}
if torch_ok:
    try:
        res = [json.loads(l[7:]) for l in open(f"{tmp}/torch.log") if l.startswith("RESULT ")][-1]
        torch.update(tok=res["tokens_per_s"], step_ms=res["step_ms"], mem=res["max_memory_allocated"],
                     reserved=res["max_memory_reserved"], res=res)
        if res["params_no_wpe"] != N:
            notes.append(f"PyTorch counts N = {res['params_no_wpe']}, the formula {N}")
    except (OSError, IndexError, KeyError, ValueError) as e:
        torch_ok = False
        notes.append(f"PyTorch printed no readable RESULT line: {e!r}")
torch["smi"] = smi_peak("torch")

gib = lambda b: "n/a" if b is None else f"{b / 2**30:.2f} GiB"
fmt_tok = lambda ok, v: f"{v:,.0f}" if ok and v is not None else "failed"
fmt_mfu = lambda ok, v: f"{100 * v * fpt / peak:.1f}%" if ok and v is not None else "failed"

print()
print(f"GPU training throughput, gpt-train vs PyTorch: GPT-2 shape {L} layers, {H} heads, {C} wide (head size {Q}),"
      f" T {T}, vocab {V}, micro-batch = batch {B} ({B * T} tokens/step), {steps} steps, median over steps"
      f" {warmup + 1}..{steps}; device {device}; {elapsed} s in all (gpt-train {gpt_wall} s, PyTorch {torch_wall} s)")
print(f"N = {N / 1e6:.2f}M parameters without the position embedding; FLOPs/token = 6N + 12*L*H*Q*T ="
      f" {fpt / 1e6:.1f}M; MFU against a peak of {peak / 1e12:.0f} TFLOP/s"
      f" ({'H100/H200 SXM dense bf16' if float(peak_tflops) == 989 else 'PEAK_TFLOPS'})")
torch_desc = "PyTorch: " + (torch["res"]["dtype"] + " autocast" if torch_ok else "bf16 autocast") + \
    (", torch.compile" if torch_ok and torch["res"]["compile"] else "") + \
    (f" (eager: torch.compile failed, {torch['res']['compile_error']})" if torch_ok and torch["res"].get("compile_error")
     else "") + \
    (", fused AdamW" if torch_ok and torch["res"]["fused_adamw"] else "")
gemm_bf16 = "gemm" in param_dtype_text.lower()
if precision_keys.strip():
    gpt_desc = (f"gpt-train has precision keys ({precision_keys.strip()}); this run left them at their defaults"
                f" (parallel.param_dtype {param_dtype})")
elif param_dtype == "bf16" and gemm_bf16:
    gpt_desc = f"gpt-train: parallel.param_dtype bf16, which this binary documents as \"{param_dtype_text}\""
else:
    gpt_desc = (f"gpt-train computes in fp32 on the GPU (parallel.param_dtype {param_dtype}; this binary has no"
                " compute-precision key" + ("" if gemm_bf16 else " and no bf16 GEMM path") +
                "; fp32 cuBLASLt GEMMs without TF32)")
if gpt_set:
    gpt_desc += f"; GPT_TRAIN_SET={gpt_set}"
print(gpt_desc)
print(torch_desc)
print()
print(f"  {'':<12} {'tokens/s':>12} {'ms/step':>9} {'TFLOP/s':>8} {'MFU':>7} {'peak memory':>14} {'nvidia-smi':>12}")
for name, ok, d, memlabel in (("gpt-train", gpt_ok, gpt, "tracked"), ("PyTorch", torch_ok, torch, "allocated")):
    tok = d["tok"] if ok else None
    print(f"  {name:<12} {fmt_tok(ok, tok):>12} {(f'%.1f' % d['step_ms']) if ok and tok else 'failed':>9}"
          f" {(f'%.1f' % (tok * fpt / 1e12)) if ok and tok else 'failed':>8} {fmt_mfu(ok, tok):>7}"
          f" {gib(d['mem']) if ok else 'failed':>14} {gib(d['smi']):>12}")
if gpt_ok and torch_ok and gpt["tok"] and torch["tok"]:
    ratio = gpt["tok"] / torch["tok"]
    print(f"  ratio gpt-train / PyTorch: {ratio:.3f}x   target >= 1.0x   {'PASS' if ratio >= 1.0 else 'FAIL'}")
else:
    print("  ratio gpt-train / PyTorch: failed (a side did not finish)")
if gpt_ok and gpt["tok"]:
    mfu = gpt["tok"] * fpt / peak
    print(f"  gpt-train MFU: {100 * mfu:.1f}%   target >= 50%   {'PASS' if mfu >= 0.5 else 'FAIL'}")
print("  peak memory: gpt-train = its tracked allocator's total peak (summary.json mem_peak_bytes.total; excludes"
      " the CUDA context and library workspaces); PyTorch = torch.cuda.max_memory_allocated()"
      + (f" (reserved {gib(torch['reserved'])})" if torch_ok and torch.get("reserved") is not None else "")
      + ("; nvidia-smi = device memory.used peak minus the idle reading before the run" if have_smi
         else "; nvidia-smi: not available"))
if gpt_ok and gpt["run_tok"]:
    notes.append(f"gpt-train's whole-run average (summary.json, warm-up and final eval included):"
                 f" {gpt['run_tok']:,.0f} tokens/s")
for n in notes:
    print("  note: " + n)
json.dump({"gpt_tok": gpt["tok"] if gpt_ok else None, "torch_tok": torch["tok"] if torch_ok else None, "fpt": fpt,
           "peak": peak}, open(f"{tmp}/reference.json", "w"))
EOF

# --- the per-op breakdown (after the table) -------------------------------------------------------------------
if ((PROFILE_STEPS > 0)) && ! fits 60; then
  echo
  echo "per-op profile run skipped: its 60 s would pass TIME_LIMIT ($TIME_LIMIT s; $(($(date +%s) - START)) s gone)"
elif ((PROFILE_STEPS > 0)); then
  PDIR=$TMP/profile
  P_RC=0
  GPT_TRAIN_CUDA_PROFILE=1 timeout -k 5 60 "$GPT_TRAIN" train --config "$TMP/gpt.yaml" "${GPT_ARGS[@]}" \
    --set "run.out_dir=$PDIR" --set "training.steps=$((PROFILE_STEPS + 1))" >"$TMP/profile.log" 2>&1 || P_RC=$?
  echo
  if ((P_RC != 0)); then
    echo "per-op profile run FAILED: $(why "$P_RC" 60); last lines of its log:"
    tail -n 6 "$TMP/profile.log" | cut -c1-200 | sed 's/^/    | /'
  else
    echo "per-op device time, gpt-train as in the table, $PROFILE_STEPS steps after a first one left out (cuBLASLt's"
    echo "heuristics, the kernels' first loads) and before the final eval (events before and after each op, ops back"
    echo "to back), the 30 largest:"
    TABLE=$(sed -n '/CUDA op time/,/^ *total /p' "$TMP/profile.log" | sed 's/^.*\] //' | awk 'NR <= 32 || /^ *total /')
    echo "${TABLE:-  (no per-op table in its log: GPT_TRAIN_CUDA_PROFILE times the CUDA backend only)}"
    # Beside PyTorch's kernels (pytorch_gpt2.py --profile-steps), by kind, per step.
    "$PYTHON" "$ROOT/scripts/bench/by_kind.py" "$TMP/profile.log" "$TMP/torch.log" "$PROFILE_STEPS"
  fi
fi

# --- variants of the gpt-train run (last) ---------------------------------------------------------------------
IFS=';' read -r -a VARIANT_LIST <<<"$VARIANTS"
((${#VARIANT_LIST[@]})) && echo && echo "gpt-train variants (the same run with these overrides; medians as above):"
for variant in "${VARIANT_LIST[@]}"; do
  [[ -n ${variant// /} ]] || continue
  if ! fits "$VARIANT_TIMEOUT"; then
    echo "  [$variant] skipped: its $VARIANT_TIMEOUT s would pass TIME_LIMIT ($TIME_LIMIT s)"
    continue
  fi
  VDIR=$TMP/variant
  rm -rf "$VDIR"
  VARGS=("${GPT_ARGS[@]}" --set "run.out_dir=$VDIR")
  VENV=()  # NAME=value words (an upper-case name): environment of this run, e.g. GPT_ATTENTION_FWD_ROWS=32
  for kv in $variant; do
    if [[ $kv =~ ^[A-Z_][A-Z0-9_]*= ]]; then VENV+=("$kv"); else VARGS+=(--set "$kv"); fi
  done
  V_RC=0
  T0=$(date +%s)
  env ${VENV[@]+"${VENV[@]}"} timeout -k 5 "$VARIANT_TIMEOUT" "$GPT_TRAIN" train --config "$TMP/gpt.yaml" "${VARGS[@]}" >"$TMP/variant.log" 2>&1 ||
    V_RC=$?
  V_WALL=$(($(date +%s) - T0))
  if ((V_RC != 0)); then
    echo "  [$variant] FAILED: $(why "$V_RC" "$VARIANT_TIMEOUT") after $V_WALL s; last lines of its log:"
    tail -n 6 "$TMP/variant.log" | cut -c1-200 | sed 's/^/    | /'
    continue
  fi
  if "$PYTHON" - "$TMP" "$WARMUP" "$variant" "$V_WALL" <<'EOF'
import json, statistics, sys
tmp, warmup, variant, wall = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ref = json.load(open(f"{tmp}/reference.json"))
rows = [json.loads(l) for l in open(f"{tmp}/variant/metrics.jsonl") if l.strip()]
timed = [r for r in rows if r["step"] > warmup]
tok = statistics.median(r["tokens_per_s"] for r in timed)
ms = statistics.median(r["step_ms"] for r in timed)
mem = max(r["mem_peak_bytes"]["total"] for r in rows)
vs = lambda base: f"{tok / base:.3f}x" if base else "n/a"
print(f"  [{variant}] {tok:,.0f} tokens/s, {ms:.1f} ms/step, MFU {100 * tok * ref['fpt'] / ref['peak']:.1f}%,"
      f" {vs(ref['gpt_tok'])} the run above, {vs(ref['torch_tok'])} PyTorch, peak {mem / 2**30:.2f} GiB ({wall} s)")
EOF
  then :; else echo "  [$variant] ran, but its metrics.jsonl could not be read"; fi
  grep -h 'GPT_GEMM_ALGOS:' "$TMP/variant.log" |
    sed 's/^.*GPT_GEMM_ALGOS: /    gemm algorithms: /' | cut -c1-2000 || true
done
# Exit status 1 when a side failed (its table cell says "failed"), after everything above has been printed.
((GPT_OK && TORCH_OK)) || exit 1
