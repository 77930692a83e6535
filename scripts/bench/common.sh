# Pieces shared by the scripts/bench benchmarks (source it; needs ROOT = the repository root). The same
# conventions as cpu_vs_pytorch.sh: Debian's python3 (the one with torch), a char-level Shakespeare corpus,
# one YAML per model shape, PyTorch's OPENBLAS_CORETYPE / OMP_WAIT_POLICY probed before the runs.

BENCH_PY=/usr/bin/python3  # Debian's interpreter: the one with torch
BENCH_TORCH=$ROOT/scripts/bench/pytorch_gpt.py

bench_log() { echo "[bench $(date +%H:%M:%S)] $*" >&2; }

# bench_prepare GPT INPUT OUT_DIR: char-tokenized train.bin / val.bin (10% val) in OUT_DIR.
bench_prepare() {
  "$1" prepare --input "$2" --tokenizer char --val-fraction 0.1 --out "$3" >/dev/null 2>&1 ||
    { echo "gpt-train prepare failed on $2" >&2; return 1; }
}

# bench_config FILE NAME OUT_DIR DATA_DIR THREADS N_LAYER N_HEAD N_EMBD BLOCK MICRO_BATCH VOCAB STEPS [GLOBAL_SEQS]
# A run config with the benchmarks' fixed optimizer settings, no lr warm-up and evaluation only at the end.
bench_config() {
  local global=""
  [[ -n ${13:-} ]] && global="
  global_batch_sequences: ${13}"
  cat >"$1" <<EOF
run:
  name: bench-$2
  out_dir: $3
  seed: 1337
  threads: $5
model:
  n_layer: $6
  n_head: $7
  n_embd: $8
  block_size: $9
  vocab_size: ${11}
  dropout: 0.0
data:
  train: $4/train.bin
  val: $4/val.bin
training:
  steps: ${12}
  micro_batch_size: ${10}$global
  lr: 1.0e-3
  min_lr: 1.0e-4
  warmup_steps: 0
  beta1: 0.9
  beta2: 0.99
  weight_decay: 0.1
  grad_clip: 1.0
  eval_interval: 0
  eval_batches: 1
logging:
  log_interval: 1000000
EOF
}

# bench_torch_blas: the BLAS PyTorch really loads (Debian's torch links libblas.so.3, which is the slow reference
# BLAS unless OpenBLAS provides it): stops the benchmark unless it is OpenBLAS or MKL, since a reference-BLAS
# PyTorch would flatter gpt-train's ratio.
bench_torch_blas() {
  local libs
  libs=$("$BENCH_PY" - <<'EOF'
import torch
torch.mm(torch.ones(64, 64), torch.ones(64, 64))
libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l})
print(" ".join(p for p in libs if any(k in p.lower() for k in ("blas", "mkl"))))
EOF
  ) || { echo "cannot import torch with $BENCH_PY (apt-get install python3-torch libopenblas0-pthread)" >&2; return 1; }
  if ! grep -qiE 'openblas|mkl' <<<"$libs"; then
    echo "PyTorch's BLAS is not OpenBLAS or MKL (${libs:-none found}): apt-get install libopenblas0-pthread," \
      "else PyTorch runs on the reference BLAS and the ratios mean nothing" >&2
    return 1
  fi
  bench_log "PyTorch's BLAS: $libs"
}

# bench_torch_env THREADS: PyTorch's best OPENBLAS_CORETYPE (torch.mm) and OMP_WAIT_POLICY (training config A,
# 30 steps) at THREADS threads per process, measured by pytorch_gpt.py --probe. Sets CORETYPE, WAIT_POLICY
# ('default' = unset) and TORCH_ENV (VAR=value words for env(1)).
bench_torch_env() {
  local probe
  bench_torch_blas
  bench_log "probing PyTorch's OPENBLAS_CORETYPE (torch.mm) and OMP_WAIT_POLICY (config A, 30 steps, $1 thread(s))"
  probe=$("$BENCH_PY" "$BENCH_TORCH" --probe --threads "$1" --n-layer 4 --n-head 4 --n-embd 128 \
    --block-size 64 --batch-size 12 --vocab-size 65 --steps 30 --warmup 5)
  CORETYPE=$(awk '$1 == "coretype" {print $2}' <<<"$probe")
  WAIT_POLICY=$(awk '$1 == "wait_policy" {print $2}' <<<"$probe")
  TORCH_ENV=(OPENBLAS_NUM_THREADS="$1" OMP_NUM_THREADS="$1")
  [[ $CORETYPE != default ]] && TORCH_ENV+=(OPENBLAS_CORETYPE="$CORETYPE")
  [[ $WAIT_POLICY != default ]] && TORCH_ENV+=(OMP_WAIT_POLICY="$WAIT_POLICY")
  bench_log "PyTorch runs with: ${TORCH_ENV[*]}"
}

# bench_metrics METRICS_JSONL WARMUP: one JSON object from gpt-train's metrics.jsonl: the medians of
# tokens_per_s and gflops over the steps after WARMUP, and the largest mem_peak_bytes of each category.
bench_metrics() {
  "$BENCH_PY" - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r for r in rows if r["step"] > int(sys.argv[2])] or rows
mem = {}
for r in rows:
    for k, v in r.get("mem_peak_bytes", {}).items():
        mem[k] = max(mem.get(k, 0), v)
print(json.dumps({"tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
                  "gflops": statistics.median(r["gflops"] for r in timed), "mem_peak_bytes": mem}))
EOF
}
