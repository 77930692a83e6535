#!/usr/bin/env bash
# Fused causal attention, gpt-train's kernels against PyTorch's scaled_dot_product_attention, forward and backward,
# at GPT shapes, in one run (issue 5: where the step's attention time stands against FlashAttention's).
#
#   scripts/bench/attention_vs_pytorch.sh                     # on the GPU machine, from the repo root
#   ATTN_BENCH=/tmp/gpt-bundle/bin/attention_bench SHAPES="16,1024,768,12" scripts/bench/attention_vs_pytorch.sh
#   DEVICE=cpu DTYPE=fp32 PYTHON=/usr/bin/python3 SHAPES="2,128,64,2" BACKENDS=default \
#     scripts/bench/attention_vs_pytorch.sh                   # pipeline smoke test, no GPU
#
# Per shape (B,T,C,NH), one after the other: build/attention_bench (every run.attention_kernel choice: auto, the
# mma.sync kernels, and wmma; each checked against the CPU backend, its `wrong` column) and
# scripts/bench/pytorch_attention.py (SDPA's default choice and each backend asked for by name), each under
# `timeout`. Both time --iters calls after --warmup ones, divided by iters; FLOPs as FlashAttention counts them
# (forward 2·B·NH·T²·hs for causal, backward 2.5 times that). The table: ms per call and TFLOP/s for forward,
# backward and both, and the ratio PyTorch ms / gpt-train ms against SDPA's default and its fastest backend
# (>= 1: gpt-train is as fast or faster). A PyTorch row marked host-bound was timed while the GPU waited for
# Python to queue the calls (queueing took >= 90% of the events' time): its kernels take less than it says.
# Then, after every shape, the first shape's default kernels again under each of ENV_VARIANTS (kernels/cuda's
# switches), each its own row (checked likewise) under that shape's gpt-train rows: where each experiment's forward
# and backward stand.
#
# Environment (defaults): ATTN_BENCH (build/attention_bench), PYTHON (python3: the one with torch), DEVICE (cuda),
# DTYPE (bf16), SHAPES ("16,1024,768,12 4,2048,2048,16": GPT-2 124M's attention, head size 64; and head size 128),
# ITERS (20), WARMUP (3), KERNELS (the bench's default: auto,wmma on cuda bf16), BACKENDS
# (default,flash,cudnn,efficient), TIMEOUT (90 s per side and shape), ENV_VARIANTS (";"-separated, each a
# space-separated list of VAR=value; on cuda by default the tiles head by head as before their order by length,
# GPT_ATTENTION_ORDER=head, then on sm_90 in bf16 the wgmma kernels' experiments: GPT_ATTENTION_WGMMA_BQ=128 (the
# warp-specialised dK/dV kernel at 128 queries per step; overlapped), _WS=2, =3, _WS_KV=2, =3
# (alone, at BQ 64, overlapped),
# GPT_ATTENTION_WGMMA_BQ=64,
# _OVERLAP=1, both, _WG2=1, =kv, =dq, with BQ 64, with the overlap, _BK=128, with WG2=fwd, _FWD_BLOCKS=4, _RS=1,
# with BQ 64, _DS_STAGE=0, and the mma.sync kernels, GPT_ATTENTION_WGMMA=0;
# "" = none), TIME_LIMIT (0; else seconds from the start after which no variant starts whose TIMEOUT would pass it).
# GPT_TRAIN_CUDA_PROFILE is unset for the bench (it would synchronize after every op). Exit status: 1 when a gpt-train
# kernel is wrong or its side fails, else 3 when only the PyTorch side failed (no torch, say), else 0.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ATTN_BENCH=${ATTN_BENCH:-build/attention_bench}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bf16}
SHAPES=${SHAPES:-16,1024,768,12 4,2048,2048,16}
ITERS=${ITERS:-20}
WARMUP=${WARMUP:-3}
KERNELS=${KERNELS:-}
BACKENDS=${BACKENDS:-default,flash,cudnn,efficient}
TIMEOUT=${TIMEOUT:-90}
TIME_LIMIT=${TIME_LIMIT:-0}
if [[ -z ${ENV_VARIANTS+set} ]]; then
  ENV_VARIANTS=""
  [[ $DEVICE == cuda ]] && ENV_VARIANTS="GPT_ATTENTION_ORDER=head"  # every CUDA attention kernel
  # On sm_90 only (where the wgmma kernels run; elsewhere the switches change nothing).
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 || true)
  if [[ $DEVICE == cuda && $DTYPE == bf16 && $cc == 9.0 ]]; then
    w=GPT_ATTENTION_WGMMA
    ENV_VARIANTS="$ENV_VARIANTS;${w}_BQ=128;${w}_BQ=128 ${w}_OVERLAP=bwd;${w}_WS=2;${w}_WS=3;${w}_WS_KV=2;${w}_WS_KV=3;${w}_WS_KV=2 ${w}_BQ=64;${w}_WS_KV=2 ${w}_OVERLAP=bwd;${w}_WS_KV=3 ${w}_OVERLAP=bwd;${w}_BQ=64;${w}_OVERLAP=1;${w}_BQ=64 ${w}_OVERLAP=1;${w}_WG2=1;${w}_WG2=kv;${w}_WG2=dq"
    ENV_VARIANTS="$ENV_VARIANTS;${w}_WG2=1 ${w}_BQ=64;${w}_WG2=1 ${w}_OVERLAP=1;${w}_BK=128;${w}_BK=128 ${w}_WG2=fwd"
    ENV_VARIANTS="$ENV_VARIANTS;${w}_FWD_BLOCKS=4;${w}_RS=1;${w}_RS=1 ${w}_BQ=64;${w}_DS_STAGE=0;$w=0"
  fi
fi
[[ $ATTN_BENCH == /* ]] || ATTN_BENCH=$PWD/$ATTN_BENCH
[[ -x $ATTN_BENCH ]] || { echo "no attention_bench binary at $ATTN_BENCH (set ATTN_BENCH)" >&2; exit 2; }
TMP=$(mktemp -d /tmp/attn-bench.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
log() { echo "[attn-bench $(date +%H:%M:%S)] $*"; }

status=0
i=0
for shape in $SHAPES; do
  IFS=, read -r B T C NH <<<"$shape"
  common=(--batch "$B" --seq "$T" --embd "$C" --heads "$NH" --iters "$ITERS" --warmup "$WARMUP")
  log "shape $shape: gpt-train ($ATTN_BENCH, timeout ${TIMEOUT}s)"
  kern=()
  [[ -n $KERNELS ]] && kern=(--kernels "$KERNELS")
  timeout -k 5 "$TIMEOUT" env -u GPT_TRAIN_CUDA_PROFILE "$ATTN_BENCH" --device "$DEVICE" --dtype "$DTYPE" \
    "${common[@]}" ${kern[@]+"${kern[@]}"} >"$TMP/ours.$i" 2>&1
  rc=$?
  echo "$rc" >"$TMP/ours_rc.$i"
  cat "$TMP/ours.$i"
  if [[ $rc != 0 ]]; then
    status=1
    [[ $rc == 1 ]] || echo "gpt-train side failed: exit status $rc$([[ $rc == 124 ]] && echo ' (timed out)')"
  fi
  log "shape $shape: PyTorch ($PYTHON, timeout ${TIMEOUT}s)"
  timeout -k 5 "$TIMEOUT" "$PYTHON" "$ROOT/scripts/bench/pytorch_attention.py" --device "$DEVICE" --dtype "$DTYPE" \
    "${common[@]}" --backends "$BACKENDS" >"$TMP/torch.$i" 2>"$TMP/torch_err.$i"
  rc=$?
  echo "$rc" >"$TMP/torch_rc.$i"
  cat "$TMP/torch.$i"
  if [[ $rc != 0 ]]; then
    [[ $status == 1 ]] || status=3
    echo "PyTorch side failed: exit status $rc$([[ $rc == 124 ]] && echo ' (timed out)'); its last lines:"
    tail -n 5 "$TMP/torch_err.$i" | sed 's/^/  | /'
  fi
  i=$((i + 1))
done

# The first shape's default kernels again under each variant: rows of their own under its gpt-train rows.
if [[ $i -gt 0 && -n $ENV_VARIANTS ]]; then
  IFS=, read -r B T C NH <<<"${SHAPES%% *}"
  common=(--batch "$B" --seq "$T" --embd "$C" --heads "$NH" --iters "$ITERS" --warmup "$WARMUP")
  IFS=';' read -ra variants <<<"$ENV_VARIANTS"
  for v in "${variants[@]}"; do
    label="auto:$(sed 's/GPT_ATTENTION_WGMMA_//g; s/GPT_ATTENTION_//g; s/ /+/g' <<<"$v")"
    if [[ $TIME_LIMIT -gt 0 && $((SECONDS + TIMEOUT)) -gt $TIME_LIMIT ]]; then
      echo "variants from $v on skipped: its ${TIMEOUT} s would pass TIME_LIMIT (${TIME_LIMIT} s)"
      break
    fi
    # shellcheck disable=SC2086  # $v: its assignments, one word each
    timeout -k 5 "$TIMEOUT" env -u GPT_TRAIN_CUDA_PROFILE $v "$ATTN_BENCH" --device "$DEVICE" --dtype "$DTYPE" \
      "${common[@]}" --kernels auto >"$TMP/variant" 2>&1
    rc=$?
    sed "s/ kernel=auto / kernel=$(sed 's/[&/\\]/\\&/g' <<<"$label") /" "$TMP/variant" | tee -a "$TMP/variants.0"
    if [[ $rc != 0 ]]; then
      status=1
      [[ $rc == 1 ]] || echo "gpt-train variant $v failed: exit status $rc$([[ $rc == 124 ]] && echo ' (timed out)')"
    fi
  done
fi

# The table, from the lines both sides printed.
"$PYTHON" - "$TMP" "$i" "$SHAPES" "$DEVICE" "$DTYPE" <<'EOF'
import re, sys
tmp, n, shapes, device, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]

def read(path):
    try:
        return open(path).read()
    except OSError:
        return ""

def why(side, s):  # a failed side: its exit status, and the last line of its stderr (else of its output)
    rc = read(f"{tmp}/{side}_rc.{s}").strip() or "?"
    lines = [l for l in read(f"{tmp}/{side}_err.{s}").splitlines() if l.strip()]
    lines = lines or [l for l in read(f"{tmp}/{side}.{s}").splitlines() if l.strip()]
    timed_out = " (timed out)" if rc in ("124", "137") else ""
    return f"exit {rc}{timed_out}: {lines[-1][:90] if lines else 'no output'}"

def rows(path, prefix, key):  # [(name, fields)] in the order printed
    out = []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return out
    for line in lines:
        if not line.startswith(prefix + " " + key + "="):
            continue
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "fwd_ms" in fields:
            out.append((fields[key], fields))
    return out

print(f"\nCausal attention, {dtype} on {device}: gpt-train vs PyTorch SDPA, ms per call (TFLOP/s); "
      "ratio = PyTorch ms / gpt-train ms (>= 1: gpt-train as fast or faster)")
head = f"{'shape B,T,C,NH':<16} {'side':<34} {'forward':>16} {'backward':>16} {'fwd+bwd':>9} {'vs default':>10} {'vs best':>8} {'check':>6}"
print(head)
print("-" * len(head))
for s in range(n):
    ours = rows(f"{tmp}/ours.{s}", "attention_bench", "kernel")
    variants = rows(f"{tmp}/variants.{s}", "attention_bench", "kernel")  # the first shape's, after its own rows
    torch = rows(f"{tmp}/torch.{s}", "pytorch_attention", "backend")
    both = lambda r: float(r["fwd_ms"]) + float(r["bwd_ms"])
    default = next((both(r) for name, r in torch if name == "default"), None)
    best = min((both(r) for _, r in torch), default=None)
    tf = lambda x: f"{x:.0f}" if x >= 10 else f"{x:.2g}"
    cell = lambda r, p: f"{float(r[p + '_ms']):.3f} ({tf(float(r[p + '_tflops']))})"
    for name, r in ours + variants:
        ratio = lambda ref: f"{ref / both(r):.2f}" if ref and both(r) > 0 else "-"
        check = "WRONG" if r.get("wrong") == "1" else "ok"
        print(f"{shapes[s]:<16} {'gpt-train ' + name:<34} {cell(r, 'fwd'):>16} {cell(r, 'bwd'):>16} "
              f"{both(r):>9.3f} {ratio(default):>10} {ratio(best):>8} {check:>6}")
    if not ours:
        print(f"{shapes[s]:<16} {'gpt-train':<34} failed: {why('ours', s)}")
    for name, r in torch:
        host = "  host-bound (Python queued no faster)" if r.get("host_bound") == "1" else ""
        print(f"{shapes[s]:<16} {'torch ' + name:<34} {cell(r, 'fwd'):>16} {cell(r, 'bwd'):>16} {both(r):>9.3f}{host}")
    if not torch:
        print(f"{shapes[s]:<16} {'torch':<34} failed: {why('torch', s)}")
EOF
exit $status
