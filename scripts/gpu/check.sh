#!/usr/bin/env bash
# The GPU check, run ON the lent GPU machine from the repo root. How a session with a GPU uses it:
#   scripts/gpu/bundle.sh          # here first: builds build-gpu and packs gpu-bundle/gpt-bundle.tar.xz (ignored)
#   device tool `run`: carry ["gpu-bundle"], command "scripts/gpu/check.sh", timeout_s 540
# With gpu-bundle/*.tar.* present it extracts the bundle to /tmp/gpt-bundle and sources its env.sh (the GPU
# machine lacks OpenMPI, oneDNN, yaml-cpp, spdlog...); without one it builds with cmake (needs those there).
# Steps, each PASS/FAIL/SKIP with seconds, and a summary printed LAST: GPU, libraries, the PTX probe (the
# mma.sync/ldmatrix/cvt/cp.async layouts alone), CUDA backend parity (gpt_tests [cuda]; when it fails, its failed
# cases again under each switch that undoes an unmeasured default, PARITY_BISECT: one INFO line each), NCCL singleton (gpt_mpi_tests [nccl]), Shakespeare 20 steps cpu vs cuda (losses within
# 1e-4 relative; then sample's greedy ids from that model, and 2 fine-tuning steps from it, cpu vs cuda),
# compute-sanitizer memcheck and racecheck (the attention kernels; in what is left after keeping
# the bench's 230 s and the attention step's 100, else a SKIP that says so), scripts/bench/gpu_vs_pytorch.sh
# if present (its table, the per-op device time of a few steps, and its default variants: run.gelu_fusion and the
# attention kernels' switches; 100 s of its time kept for the next step), then scripts/bench/attention_vs_pytorch.sh
# (the attention kernels against PyTorch's SDPA, and the wgmma kernels' switches one row each) in what is left. A test binary passes only with Catch2's "All tests passed" line
# (a filter that matches no test is a FAIL), the benchmark only when both sides ran.
# Every step has a timeout and the whole check a budget (CHECK_BUDGET_S, 460 s), so it ends inside 8 minutes.
# Full output: $OUT/check.log (the device tool brings $OUT back), or /tmp/gpt-check/check.log.
#   CHECK_STEPS="parity nccl train"  # run only these (of: parity nccl train memcheck racecheck bench attention ncu)
# ncu (not in the default steps): Nsight Compute on the default attention kernels at GPT-2 124M's shape (on sm_90 the
# wgmma forward, dK/dV and dQ kernels of attention_wgmma.cu; elsewhere the mma.sync 16-row forward, the lean dK/dV
# kernel that keeps dS^T and the dQ kernel over it), then on the 2-block mma.sync ones under GPT_ATTENTION_WGMMA=0
# GPT_ATTENTION_FWD_ROWS=32 GPT_ATTENTION_BWD_BLOCKS=2 (attention_mma.cu, attention_mma_backward.cu):
# duration, registers, occupancy, issue slots, stalls; the whole reports in $OUT/ncu_attention.txt, about 40 s.
# Without a GPU (e.g. here) the GPU steps SKIP, saying why; with one visible, a test that skips is a FAIL.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$PWD
LOGDIR=${OUT:-/tmp/gpt-check}
mkdir -p "$LOGDIR"
LOG=$LOGDIR/check.log
: > "$LOG"
WORK=/tmp/gpt-check-work
rm -rf "$WORK" && mkdir -p "$WORK"
DEADLINE=$((SECONDS + ${CHECK_BUDGET_S:-460}))
STEPS=" ${CHECK_STEPS:-parity nccl train memcheck racecheck bench attention} "
summary=()
fail=0

wanted() { [[ $STEPS == *" $1 "* ]]; }
# record STATUS NAME SECONDS NOTE
record() {
  local line
  line=$(printf '%-4s  %-28s %4ss  %s' "$1" "$2" "$3" "$4")
  summary+=("$line")
  [ "$1" = FAIL ] && fail=1
  echo "$line" | tee -a "$LOG"
}
# run_step NAME LIMIT CMD...: runs CMD (stdin closed) under a timeout capped by the budget, its output into the
# log and into $WORK/NAME.out; sets RC (124 = timed out, 200 = no time left) and T (seconds).
run_step() {
  local name=$1 limit=$2 left=$((DEADLINE - SECONDS)) t0=$SECONDS
  shift 2
  OUTF=$WORK/${name// /_}.out
  : > "$OUTF"
  if [ "$left" -lt 15 ]; then RC=200; T=0; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "=== $name (limit ${limit}s): $*" >> "$LOG"
  timeout -k 10 "$limit" "$@" < /dev/null > "$OUTF" 2>&1
  RC=$?
  T=$((SECONDS - t0))
  cat "$OUTF" >> "$LOG"
  echo "=== $name: exit $RC after ${T}s" >> "$LOG"
}
tail_of() { tail -n "${1:-6}" "$OUTF" | cut -c1-200 | sed 's/^/      | /'; }
# judge NAME: the usual verdict for a test binary: a SKIPPED line is a SKIP without a GPU and a FAIL with one.
judge() {
  local name=$1 note
  note=$(grep -oE 'All tests passed.*|test cases:.*' "$OUTF" | tail -1)
  if [ "$RC" = 200 ]; then record SKIP "$name" 0 "no time left in the budget"
  elif [ "$RC" = 124 ] || [ "$RC" = 137 ]; then record FAIL "$name" "$T" "timed out"; tail_of
  elif grep -q SKIPPED "$OUTF"; then
    if [ "$gpus" -gt 0 ]; then record FAIL "$name" "$T" "skipped with a GPU visible: $(grep -o 'SKIPPED.*' "$OUTF" | head -1 | cut -c1-150)"
    else record SKIP "$name" "$T" "$(grep -o 'SKIPPED.*' "$OUTF" | head -1 | cut -c1-150)"; fi
  elif [ "$RC" = 0 ] && grep -q 'All tests passed' "$OUTF"; then record PASS "$name" "$T" "$note"
  elif [ "$RC" = 0 ]; then record FAIL "$name" "$T" "no 'All tests passed' (did the filter match no test?)"; tail_of
  else record FAIL "$name" "$T" "exit $RC ${note}"; tail_of 8; fi
}
# fail_or_skip NAME: the verdict for a run that did not exit 0 (RC 200: the budget ran out before it started).
fail_or_skip() {
  if [ "$RC" = 200 ]; then record SKIP "$1" 0 "no time left in the budget"
  else record FAIL "$1" "$T" "exit $RC"; tail_of; fi
}

# --- a. the GPU
gpu_line=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
gpus=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "nvidia-smi: $gpu_line" >> "$LOG"
if [ "${gpus:-0}" -gt 0 ]; then record PASS "nvidia-smi" 0 "$gpus GPU(s): $gpu_line"
else gpus=0; record SKIP "nvidia-smi" 0 "no GPU visible ($(echo "$gpu_line" | cut -c1-80))"; fi

# --- the binaries: the bundle, else a build
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# cuBLASLt's own errors (level 1: errors only) into the steps' output: a GEMM it rejects names its reason there.
export CUBLASLT_LOG_LEVEL=${CUBLASLT_LOG_LEVEL:-1}
tarball=$(ls gpu-bundle/*.tar.* 2>/dev/null | head -1)
if [ -n "$tarball" ]; then
  t0=$SECONDS
  rm -rf /tmp/gpt-bundle
  case $tarball in *.zst) unpack=(--zstd) tool=zstd ;; *.xz) unpack=(-J) tool=xz ;; *) unpack=() tool=tar ;; esac
  if command -v "$tool" > /dev/null; then tar -x "${unpack[@]}" -f "$tarball" -C /tmp >> "$LOG" 2>&1
  else  # no xz binary on the image: python's tarfile reads xz itself
    python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
try: t.extractall("/tmp", filter="fully_trusted")
except TypeError: t.extractall("/tmp")' "$tarball" >> "$LOG" 2>&1
  fi
  if [ -f /tmp/gpt-bundle/env.sh ]; then
    # shellcheck disable=SC1091
    source /tmp/gpt-bundle/env.sh
    record PASS "bundle" $((SECONDS - t0)) "$tarball -> /tmp/gpt-bundle"
  else
    record FAIL "bundle" $((SECONDS - t0)) "could not extract $tarball"
  fi
  GPT_TRAIN=/tmp/gpt-bundle/bin/gpt-train GPT_TESTS=/tmp/gpt-bundle/bin/gpt_tests
  GPT_MPI_TESTS=/tmp/gpt-bundle/bin/gpt_mpi_tests HOME_DIR=/tmp/gpt-bundle ATTN_BENCH=/tmp/gpt-bundle/bin/attention_bench
else
  BUILD=${BUILD_DIR:-build-gpu}
  run_step "configure" 120 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPT_CUDA=ON
  if [ "$RC" = 0 ]; then record PASS "configure (no bundle)" "$T" "$BUILD"; else record FAIL "configure (no bundle)" "$T" "exit $RC"; tail_of; fi
  run_step "build" 300 cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target gpt-train gpt_tests gpt_mpi_tests \
    attention_bench
  if [ "$RC" = 0 ]; then record PASS "build" "$T" ""; else record FAIL "build" "$T" "exit $RC"; tail_of; fi
  GPT_TRAIN=$BUILD/gpt-train GPT_TESTS=$BUILD/tests/gpt_tests GPT_MPI_TESTS=$BUILD/tests/comm/gpt_mpi_tests
  HOME_DIR=$ROOT ATTN_BENCH=$BUILD/attention_bench
fi
export GPT_TRAIN ATTN_BENCH  # for the benchmark scripts
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}" >> "$LOG"
env | grep -E '^(OMPI|OPAL)_' >> "$LOG"

# --- the libraries: everything resolves (and where the CUDA ones come from)
t0=$SECONDS
ldd "$GPT_TRAIN" "$GPT_TESTS" "$GPT_MPI_TESTS" > "$WORK/ldd.out" 2>&1
cat "$WORK/ldd.out" >> "$LOG"
missing=$(grep -E 'not found' "$WORK/ldd.out" | sed 's/^\s*//' | sort -u | tr '\n' ' ')
cuda_from=$(grep -E 'lib(cudart|cublasLt|nccl)\.so' "$WORK/ldd.out" | awk '{print $3}' | sort -u | tr '\n' ' ')
# cuBLASLt is not linked but opened when a CUDA backend is made (kernels/cuda/cublaslt_loader.h), by its soname:
# where dlopen finds it (LD_LIBRARY_PATH, the binary's RUNPATH, the linker cache).
cuda_major=$(grep -oE 'libcudart\.so\.[0-9]+' "$WORK/ldd.out" | head -1 | sed 's/.*\.//')
lt=""
if [ -n "$cuda_major" ]; then
  runpath=$(readelf -d "$GPT_TRAIN" 2>/dev/null | sed -n 's/.*R.*PATH.*\[\(.*\)\]/\1/p')
  ldp=${LD_LIBRARY_PATH:-}
  for d in ${ldp//:/ } ${runpath//:/ }; do
    if [ -e "$d/libcublasLt.so.$cuda_major" ]; then lt="$d/libcublasLt.so.$cuda_major"; break; fi
  done
  [ -n "$lt" ] || lt=$(/sbin/ldconfig -p 2>/dev/null | grep -oE "/[^ ]*/libcublasLt\.so\.$cuda_major\$" | head -1)
  if [ -n "$lt" ]; then cuda_from="$cuda_from$lt"; else missing="$missing libcublasLt.so.$cuda_major (opened by dlopen)"; fi
fi
if [ ! -x "$GPT_TRAIN" ]; then record FAIL "libraries" 0 "no binaries"
elif [ -n "$missing" ]; then record FAIL "libraries" $((SECONDS - t0)) "missing: ${missing:0:300}"
else record PASS "libraries" $((SECONDS - t0)) "CUDA libs: ${cuda_from:0:300}"; fi

# failed_cases OUTPUT: the names of the test cases that failed in a Catch2 console OUTPUT of $GPT_TESTS "[cuda]~[ws]",
# one per line as a test spec (',', '[', '*' and '\' escaped), for -f: each failure's header (between two lines of
# dashes) starts with its case's name, wrapped at 80 columns; matched against the listed names without whitespace.
failed_cases() {
  "$GPT_TESTS" --list-test-names-only "[cuda]~[ws]" 2> /dev/null | python3 -c '
import re, sys
names = [n.rstrip("\n") for n in sys.stdin if n.strip()]
lines = open(sys.argv[1], errors="replace").read().splitlines()
squash = lambda s: re.sub(r"\s+", "", s)
heads, i = [], 0
while i < len(lines):
    if re.fullmatch(r"-{20,}", lines[i]):
        j = i + 1
        while j < len(lines) and not re.fullmatch(r"-{20,}", lines[j]): j += 1
        heads.append(squash("".join(lines[i + 1:j]))); i = j + 1
    else:
        i += 1
for n in names:
    if any(h.startswith(squash(n)) for h in heads):
        print(re.sub(r"([\\,\[*])", r"\\\1", n))' "$1"
}
# parity_bisect SPEC: after a failed parity step, its failed cases (SPEC, from failed_cases) again under each switch
# that undoes a default changed since the last GPU run, each a line of the summary, within PARITY_BISECT_S (120 s) in
# all: "passes with S" names the change S undoes as the suspect; failing under all of them points at the changes that
# have no switch (kernels/cuda/README.md, "Changed since"). A case that sets S itself (the wgmma variants case sets
# FWD_BLOCKS and BIAS in its own scopes) sees it only in part: its line says less.
PARITY_BISECT=${PARITY_BISECT:-GPT_ATTENTION_WGMMA_BIAS=0 GPT_ATTENTION_WGMMA_DS_STAGE=0 GPT_ATTENTION_ORDER=head \
  GPT_ATTENTION_WGMMA_FWD_BLOCKS=4 GPT_ATTENTION_WGMMA=fwd GPT_ATTENTION_WGMMA=0}
parity_bisect() {
  local spec=$1 sw n stop=$((SECONDS + ${PARITY_BISECT_S:-120})) limit
  n=$(wc -l < "$spec")
  if [ "$n" = 0 ]; then record INFO "parity bisect" 0 "no failed case found in the parity output"; return; fi
  sed 's/^/      failed: /' "$spec" | tee -a "$LOG"
  for sw in $PARITY_BISECT; do
    limit=$((stop - SECONDS)); [ "$limit" -gt 45 ] && limit=45
    if [ "$limit" -lt 10 ]; then record SKIP "parity with $sw" 0 "the bisect's time (PARITY_BISECT_S) is spent"; continue; fi
    run_step "parity with $sw" "$limit" env "$sw" "$GPT_TESTS" -f "$spec"
    if [ "$RC" = 200 ]; then record SKIP "parity with $sw" 0 "no time left in the budget"
    elif [ "$RC" = 0 ] && grep -q 'All tests passed' "$OUTF"; then
      record INFO "parity with $sw" "$T" "the $n failed case(s) pass: the change it undoes is the suspect"
    else record INFO "parity with $sw" "$T" "still fails (exit $RC): $(grep -oE 'test cases:.*' "$OUTF" | tail -1)"; fi
  done
}

# --- b. CUDA backend parity (tests/kernels/parity_*_test.cc)
# First the PTX probe alone (its own line: whether mma.sync, ldmatrix, cvt and cp.async have the layouts the
# attention kernels assume, apart from the kernels), then every [cuda] case, the warp-specialised ones ([ws]) last.
if wanted parity; then
  run_step "ptx probe" 30 "$GPT_TESTS" "PTX probe*"; judge "PTX probe (mma/ldmatrix)"
  grep -h "^PTX probe:" "$OUTF" | head -6 | cut -c1-200 | sed 's/^/      | /' | tee -a "$LOG"
  run_step "parity" 120 "$GPT_TESTS" "[cuda]~[ws]"; judge "parity [cuda]"
  bisect=""
  case $RC in 0 | 124 | 137 | 200) ;; *) [ "$gpus" -gt 0 ] && bisect=$WORK/parity_failed.txt && failed_cases "$OUTF" > "$bisect" ;; esac
  # The warp-specialised kernels' cases (experiments; their mbarrier waits could hang where the emulator has not
  # seen it): apart, so that a hang costs only this step. Then the bisect of a failed parity step.
  run_step "parity ws" 60 "$GPT_TESTS" "[ws]"; judge "parity warp-specialised [ws]"
  [ -n "$bisect" ] && parity_bisect "$bisect"
fi

# --- c. NCCL at one rank: a singleton (no mpirun in the bundle); more ranks where there are GPUs and mpirun
if wanted nccl; then
  run_step "nccl" 90 "$GPT_MPI_TESTS" "[nccl]"; judge "nccl [nccl] np 1"
  if [ "$gpus" -gt 1 ] && command -v mpirun > /dev/null; then
    run_step "nccl_np" 120 mpirun -np "$gpus" --oversubscribe "$GPT_MPI_TESTS" "[nccl]"; judge "nccl [nccl] np $gpus"
  fi
fi

# --- e. Shakespeare, 20 steps on cpu and on cuda: the same losses within 1e-4 relative, and falling
compare_losses() {  # compare_losses A.jsonl B.jsonl LABEL_A LABEL_B
  python3 - "$@" <<'EOF'
import json, math, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
la, lb = sys.argv[3], sys.argv[4]
steps = sorted(a)
if not steps or steps != sorted(b):
    print(f"step mismatch: {la} {len(a)} steps, {lb} {len(b)}"); sys.exit(1)
for name, d in ((la, a), (lb, b)):
    bad = [s for s in steps if not isinstance(d[s], (int, float)) or not math.isfinite(d[s])]
    if bad:
        print(f"{name}: loss not finite at step {bad[0]} ({d[bad[0]]})"); sys.exit(1)
rel = [(abs(a[s] - b[s]) / max(abs(a[s]), 1e-12), s) for s in steps]
worst, at = max(rel)
first, last = steps[0], steps[-1]
ok = worst <= 1e-4 and a[last] < a[first] and b[last] < b[first]
print(f"{la} {a[first]:.6f}->{a[last]:.6f} {lb} {b[first]:.6f}->{b[last]:.6f} max rel diff {worst:.2e} (step {at})")
sys.exit(0 if ok else 1)
EOF
}
last_loss() { tail -n 1 "$1/metrics.jsonl" 2>/dev/null | grep -oE '"(step|loss|val_loss|tokens_per_s)":[0-9.e+-]*' | tr '\n' ' '; }
if wanted train; then
  # 5 warm-up steps instead of the config's 100, so that the 20 steps reach the full learning rate and the
  # losses falling is no accident of a tiny one.
  train=("$GPT_TRAIN" train -c "$HOME_DIR/configs/shakespeare-char-cpu.yaml" --set training.steps=20
         --set training.warmup_steps=5
         --set training.eval_interval=0 --set training.eval_batches=1 --set logging.log_interval=5
         --set data.train="$HOME_DIR/data/shakespeare_char/train.bin"
         --set data.val="$HOME_DIR/data/shakespeare_char/val.bin")
  cpu_dir=$WORK/train-cpu gpu_dir=$WORK/train-cuda
  if [ ! -f "$HOME_DIR/data/shakespeare_char/train.bin" ]; then
    record SKIP "train cpu vs cuda" 0 "no data at $HOME_DIR/data/shakespeare_char (make the bundle)"
  else
    run_step "train_cpu" 90 "${train[@]}" --set run.device=cpu --set run.threads=16 --set run.out_dir="$cpu_dir"
    cpu_rc=$RC; cpu_t=$T
    if [ "$cpu_rc" = 0 ]; then record PASS "train 20 steps cpu" "$cpu_t" "$(last_loss "$cpu_dir")"
    else fail_or_skip "train 20 steps cpu"; fi
    run_step "train_cuda" 90 "${train[@]}" --set run.device=cuda --set run.out_dir="$gpu_dir"
    cuda_rc=$RC
    if [ "$RC" = 0 ] && grep -q "allocations after the first step" "$OUTF"; then
      record FAIL "train 20 steps cuda" "$T" "device memory allocated after step 1: $(grep -o '[0-9]* tracked allocations' "$OUTF" | head -1)"
    elif [ "$RC" = 0 ]; then
      # The driver's count after step 1 over the tracked buffers: the CUDA context, cuBLAS(Lt), allocation rounding;
      # and of that what came after the start, which parallel.device_memory_reserve_gb must cover.
      dm=$(sed -nE 's/.*device memory after step 1: ([0-9.]+ [KMG]?i?B) in use.*the other (-?[0-9.]+ [KMG]?i?B).* (-?[0-9.]+ [KMG]?i?B) came since.*/device \1 in use, \2 untracked, \3 of it since the start/p' "$OUTF" | head -1)
      record PASS "train 20 steps cuda" "$T" "$(last_loss "$gpu_dir")${dm:+; $dm}"
    elif [ "$gpus" = 0 ]; then record SKIP "train 20 steps cuda" "$T" "no GPU: $(grep -iE 'error|cuda' "$OUTF" | tail -1 | cut -c1-150)"
    else fail_or_skip "train 20 steps cuda"; fi
    if [ "$cpu_rc" = 0 ] && [ "$RC" = 0 ]; then
      t0=$SECONDS
      note=$(compare_losses "$cpu_dir/metrics.jsonl" "$gpu_dir/metrics.jsonl" cpu cuda 2>&1)
      rc=$?
      echo "compare: $note" >> "$LOG"
      if [ "$rc" = 0 ]; then record PASS "losses cpu == cuda (1e-4)" $((SECONDS - t0)) "$note"
      else record FAIL "losses cpu == cuda (1e-4)" $((SECONDS - t0)) "$note"; fi
    else
      record SKIP "losses cpu == cuda (1e-4)" 0 "needs both runs"
    fi
    # The same run under ddp and zero3 on one GPU: parameters and gradients go through NCCL (a world of
    # one), so the per-step losses must equal single's; and the bf16 policy (bf16 GEMMs) must also learn.
    if [ "$RC" = 0 ] && [ "$gpus" != 0 ]; then
      for strat in ddp zero3; do
        run_step "train_cuda_$strat" 90 "${train[@]}" --set run.device=cuda --set parallel.strategy=$strat \
          --set run.out_dir="$WORK/train-cuda-$strat"
        if [ "$RC" != 0 ]; then fail_or_skip "cuda $strat via NCCL"; continue; fi
        note=$(compare_losses "$gpu_dir/metrics.jsonl" "$WORK/train-cuda-$strat/metrics.jsonl" single "$strat" 2>&1)
        if [ $? = 0 ]; then record PASS "cuda $strat via NCCL == single" "$T" "$note"
        else record FAIL "cuda $strat via NCCL == single" "$T" "$note"; fi
      done
      run_step "train_cuda_bf16" 90 "${train[@]}" --set run.device=cuda --set parallel.param_dtype=bf16 \
        --set run.out_dir="$WORK/train-cuda-bf16"
      if [ "$RC" = 0 ]; then
        # The planner's device workspace (cuBLASLt, scratch, bf16 cast areas) against what the backend allocated.
        ws=$(grep -oE 'workspace +planned +[0-9.]+ [KMG]?i?B +measured +[0-9.]+ [KMG]?i?B' "$OUTF" | tail -1 | tr -s ' ')
        record PASS "cuda bf16 GEMMs, 20 steps" "$T" "$(last_loss "$WORK/train-cuda-bf16"); ${ws:-no planned-vs-measured line}"
        # zero2 under bf16 through NCCL: its ops take the gathered bf16 parameters (publish) instead of single's
        # rounded master weights, the same values, so the same losses.
        run_step "train_cuda_bf16_zero2" 90 "${train[@]}" --set run.device=cuda --set parallel.param_dtype=bf16 \
          --set parallel.strategy=zero2 --set run.out_dir="$WORK/train-cuda-bf16-zero2"
        if [ "$RC" != 0 ]; then fail_or_skip "cuda bf16 zero2 via NCCL"
        else
          note=$(compare_losses "$WORK/train-cuda-bf16/metrics.jsonl" "$WORK/train-cuda-bf16-zero2/metrics.jsonl" single zero2 2>&1)
          if [ $? = 0 ]; then record PASS "cuda bf16 zero2 == bf16 single" "$T" "$note"
          else record FAIL "cuda bf16 zero2 == bf16 single" "$T" "$note"; fi
        fi
      else fail_or_skip "cuda bf16 GEMMs, 20 steps"; fi
    fi
    # Sampling on the GPU (its KV cache and attention_forward_rows): the cuda run's model continues greedily alike
    # on both devices, fp32 both (200 tokens: past the block size of 64, so the sliding window runs too).
    if [ "$cpu_rc" = 0 ] && [ "$cuda_rc" = 0 ] && [ "$gpus" != 0 ]; then
      greedy=("$GPT_TRAIN" sample --run "$gpu_dir" --prompt-ids 1,2,3 --ids --top-k 1 -n 200)
      run_step "sample_cpu" 60 "${greedy[@]}" --device cpu
      ids_cpu=$(grep -E '^[0-9 ]+$' "$OUTF" | tail -1) sample_cpu_rc=$RC
      run_step "sample_cuda" 60 "${greedy[@]}" --device cuda
      ids_cuda=$(grep -E '^[0-9 ]+$' "$OUTF" | tail -1)
      if [ "$sample_cpu_rc" != 0 ]; then RC=$sample_cpu_rc; fail_or_skip "sample cpu (for cuda == cpu)"
      elif [ "$RC" != 0 ]; then fail_or_skip "sample cuda == cpu (greedy)"
      elif [ -n "$ids_cpu" ] && [ "$ids_cpu" = "$ids_cuda" ]; then
        record PASS "sample cuda == cpu (greedy)" "$T" "$(wc -w <<< "$ids_cuda") ids alike"
      else
        at=$(paste -d' ' <(tr ' ' '\n' <<< "$ids_cpu") <(tr ' ' '\n' <<< "$ids_cuda") | awk '$1 != $2 {print NR; exit}')
        # (A near-tie of the top two logits, within fp32 rounding, would also flip an id: then every later one too.)
        record FAIL "sample cuda == cpu (greedy)" "$T" "id ${at:-?} of $(wc -w <<< "$ids_cpu") differs (a near-tie?): cpu '$(cut -d' ' -f"${at:-1}"- <<< "$ids_cpu" | cut -c1-40)...' cuda '$(cut -d' ' -f"${at:-1}"- <<< "$ids_cuda" | cut -c1-40)...'"
      fi
      # Fine-tuning on the GPU: 2 steps from the cpu run's model (checkpoint.init_from, staged through host memory
      # onto the device) lose what the same 2 steps on the CPU lose.
      ft=("${train[@]}" --set training.steps=2 --set checkpoint.init_from="$cpu_dir/model")
      run_step "init_from_cpu" 60 "${ft[@]}" --set run.device=cpu --set run.threads=16 --set run.out_dir="$WORK/ft-cpu"
      ft_cpu_rc=$RC
      run_step "init_from_cuda" 60 "${ft[@]}" --set run.device=cuda --set run.out_dir="$WORK/ft-cuda"
      if [ "$ft_cpu_rc" != 0 ]; then RC=$ft_cpu_rc; fail_or_skip "init_from cpu (for cuda == cpu)"
      elif [ "$RC" != 0 ]; then fail_or_skip "init_from cuda == cpu (1e-4)"
      else
        note=$(compare_losses "$WORK/ft-cpu/metrics.jsonl" "$WORK/ft-cuda/metrics.jsonl" cpu cuda 2>&1)
        if [ $? = 0 ]; then record PASS "init_from cuda == cpu (1e-4)" "$T" "$note"
        else record FAIL "init_from cuda == cpu (1e-4)" "$T" "$note"; fi
      fi
    fi
  fi
fi

# --- d. compute-sanitizer: memcheck on every CUDA test, racecheck on the fused attention
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
  /usr/local/cuda*/compute-sanitizer/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)
# The benchmark (its two sides at batch 64, the profile and the first variants: 230 s) and the attention step's
# variant rows (100 s) come before the sanitizers, whose speed on the GPU is not known: each sanitizer runs in what
# is left over those, and is a SKIP that says so when too little is left or when it timed out in a share cut short
# for them (CHECK_STEPS="memcheck racecheck" then runs them with their own limits; racecheck took 108 s alone on
# the H200 in December, before the wgmma variants' parity cases).
bench_keep=0
if wanted bench && [ "$gpus" != 0 ] && [ -f scripts/bench/gpu_vs_pytorch.sh ]; then bench_keep=230; fi
if wanted attention && [ "$gpus" != 0 ]; then bench_keep=$((bench_keep + 100)); fi
# The sanitizer's report lines in the step's output besides its banner, a clean summary and the target's end
# (counted whole: grep -q could stop the pipeline early, and SIGPIPE would turn the count's meaning around).
sanitizer_reports() {
  grep -E '^=+ ' "$OUTF" | grep -cvE 'COMPUTE-SANITIZER|SUMMARY: 0 |terminate successfully' || true
}
sanitize() {  # sanitize TOOL LIMIT FILTER LABEL [SMALL]: SMALL 1 leaves out the GPT-2-sized shapes
  local name="$1 $4" limit=$2 share=$((DEADLINE - SECONDS - bench_keep)) cut=""
  if ! wanted "$1"; then return; fi
  if [ -z "$sanitizer" ]; then record SKIP "$name" 0 "compute-sanitizer not found"; return; fi
  if [ "$gpus" = 0 ]; then record SKIP "$name" 0 "no GPU"; return; fi
  if [ "$share" -lt "$limit" ]; then
    cut="the bench and the attention step keep ${bench_keep} s of the $((DEADLINE - SECONDS)) s left; CHECK_STEPS=\"$1\" runs it alone"
    if [ "$share" -lt 30 ]; then record SKIP "$name" 0 "not run: $cut"; return; fi
    limit=$share
  fi
  run_step "$1" "$limit" env GPT_PARITY_SMALL_SHAPES="${5:-0}" "$sanitizer" --tool "$1" --error-exitcode 1 \
    --print-limit 20 "$GPT_TESTS" "$3"
  local summary_line
  summary_line=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTF" | tail -1 | sed 's/^=* *//')
  if [ "$RC" = 200 ]; then record SKIP "$name" 0 "no time left in the budget"
  elif grep -qiE 'Device not supported|Target application terminated before first instrumented API call' "$OUTF"; then
    record SKIP "$name" "$T" "the sanitizer cannot use this device: $(grep -iE 'not supported|error' "$OUTF" | head -1 | cut -c1-120)"
  elif { [ "$RC" = 124 ] || [ "$RC" = 137 ]; } && [ -n "$cut" ] && [ "$(sanitizer_reports)" = 0 ]; then
    record SKIP "$name" "$T" "timed out in its ${limit} s share, no error found before: $cut"; tail_of 3
  elif [ "$RC" = 124 ] || [ "$RC" = 137 ]; then record FAIL "$name" "$T" "timed out"; tail_of
  elif grep -q SKIPPED "$OUTF"; then record FAIL "$name" "$T" "tests skipped under the sanitizer"; tail_of
  elif [ "$RC" = 0 ] && grep -q 'All tests passed' "$OUTF"; then record PASS "$name" "$T" "$summary_line"
  elif [ "$RC" = 0 ]; then record FAIL "$name" "$T" "no 'All tests passed' (did the filter match no test?)"; tail_of
  else record FAIL "$name" "$T" "exit $RC $summary_line"; tail_of 10; fi
}
sanitize memcheck 150 "[cuda]" "[cuda]"
# The fp32 attention and the tensor-core ones (mma.sync, WMMA: cp.async double buffering, ldmatrix) alike, and
# sampling's KV-cache kernel (shared scores and reductions reused chunk after chunk). At the small shapes only: on an
# H200 racecheck spent over 100 s on GPT-2 124M's attention shape (T 1024) alone, and the small ones cover every
# kernel, tile edge and head size.
sanitize racecheck 240 "parity: fused attention*,parity: tensor-core attention*,parity: attention over a KV*" \
  "attention kernels" 1

# --- f. the benchmark against PyTorch (scripts/bench/gpu_vs_pytorch.sh prints its own table)
bench_tail=""
if wanted bench; then
  if [ ! -f scripts/bench/gpu_vs_pytorch.sh ]; then record SKIP "bench gpu vs pytorch" 0 "scripts/bench/gpu_vs_pytorch.sh not there"
  elif [ "$gpus" = 0 ]; then record SKIP "bench gpu vs pytorch" 0 "no GPU"
  else
    # Its sides' timeouts, and the extra runs after its table, fit the step's limit (the budget may cut it below
    # 330 s), less 100 s kept for the attention step when that is wanted, if 150 s still fit (the two sides took 53 s
    # at batch 64 on an H200 with a warm torch.compile cache; the variants start only while their timeout fits).
    bench_limit=$((DEADLINE - SECONDS))
    [ "$bench_limit" -gt 330 ] && bench_limit=330
    bench_time=$((bench_limit > 20 ? bench_limit - 10 : 10))
    if wanted attention && [ $((bench_time - 100)) -ge 150 ]; then bench_time=$((bench_time - 100)); fi
    TIME_LIMIT=$bench_time run_step "bench" 330 bash scripts/bench/gpu_vs_pytorch.sh
    # From the table on: the table, the per-op profile and the variants (the whole output is in the log)
    bench_tail=$(sed -n '/^GPU training throughput/,$p' "$OUTF" | head -n 70 | cut -c1-160)
    [ -n "$bench_tail" ] || bench_tail=$(tail -n 25 "$OUTF" | cut -c1-160)
    targets=$(grep -oE 'ratio gpt-train / PyTorch: [0-9.]+x|gpt-train MFU: [0-9.]+%' "$OUTF" | tr '\n' ' ')
    if [ "$RC" = 200 ]; then record SKIP "bench gpu vs pytorch" 0 "no time left in the budget"
    elif [ "$RC" = 0 ]; then record PASS "bench gpu vs pytorch" "$T" "$targets"
    elif [ "$RC" = 1 ] && side=$(grep -m1 -oE '^--- (gpt-train|PyTorch) FAILED[^;]*' "$OUTF"); then
      record FAIL "bench gpu vs pytorch" "$T" "$side"  # a side failed (its log's last lines are in the table's place)
    else record FAIL "bench gpu vs pytorch" "$T" "exit $RC$([ "$RC" = 124 ] && echo ' (timed out)')"; tail_of; fi
  fi
fi

# --- g. attention against PyTorch's SDPA (scripts/bench/attention_vs_pytorch.sh), in what is left of the budget
attn_tail=""
if wanted attention; then
  if [ "$gpus" = 0 ]; then record SKIP "attention vs pytorch sdpa" 0 "no GPU"
  elif [ $((DEADLINE - SECONDS)) -lt 60 ]; then
    record SKIP "attention vs pytorch sdpa" 0 \
      "$((DEADLINE - SECONDS)) s left of the budget, under the 60 s it needs (CHECK_STEPS=attention runs it alone)"
  else
    # Each side of each shape gets its share of the step's first 120 s (the script's own timeouts then end it
    # first, table printed), the first shape's variants (the wgmma kernels' switches, one row each) what is left
    # of the step but 15 s; under 100 s only the first shape (GPT-2 124M's) runs.
    attn_limit=$((DEADLINE - SECONDS))
    [ "$attn_limit" -gt 160 ] && attn_limit=160
    attn_shapes="16,1024,768,12 4,2048,2048,16"
    [ "$attn_limit" -lt 100 ] && attn_shapes="16,1024,768,12"
    attn_sides=$((attn_limit < 120 ? attn_limit : 120))
    attn_timeout=$(((attn_sides - 15) / (2 * $(wc -w <<< "$attn_shapes"))))
    run_step "attention" "$attn_limit" env TIMEOUT="$attn_timeout" SHAPES="$attn_shapes" \
      TIME_LIMIT=$((attn_limit - 15)) bash scripts/bench/attention_vs_pytorch.sh
    attn_tail=$(sed -n '/^Causal attention/,$p' "$OUTF" | head -n 30 | cut -c1-160)
    if [ "$RC" = 200 ]; then record SKIP "attention vs pytorch sdpa" 0 "no time left in the budget"
    elif [ "$RC" = 0 ]; then record PASS "attention vs pytorch sdpa" "$T" "every kernel within its bound of the CPU's"
    elif [ "$RC" = 3 ]; then
      record PASS "attention vs pytorch sdpa" "$T" "every kernel within its bound of the CPU's; the PyTorch side $(grep -m1 -oE 'failed: .*' <<< "$attn_tail" | cut -c1-100)"
    else
      case $RC in 124 | 137) why=" (timed out)" ;; *) why="" ;; esac
      record FAIL "attention vs pytorch sdpa" "$T" "exit $RC$why$(grep -q 'wrong=1' "$OUTF" && echo ': a kernel is WRONG')"
      [ -n "$attn_tail" ] || tail_of 8
    fi
  fi
fi

# --- h. Nsight Compute on the attention kernels (only when CHECK_STEPS names ncu)
ncu_tail=""
if [[ " ${CHECK_STEPS:-} " == *" ncu "* ]]; then
  ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ "$gpus" = 0 ]; then record SKIP "ncu attention kernels" 0 "no GPU"
  elif [ -z "$ncu_bin" ]; then record SKIP "ncu attention kernels" 0 "ncu not found"
  else
    # --clock-control none: the clocks as a training run has them (the device tool's METHOD.md).
    ncu_args=(--clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats
              --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats
              --section MemoryWorkloadAnalysis --section InstructionStats)
    attn_args=(--device cuda --dtype bf16 --batch 16 --seq 1024 --embd 768 --heads 12 --iters 1 --warmup 0)
    run_step "ncu_rows16" 60 "$ncu_bin" "${ncu_args[@]}" \
      --kernel-name regex:'attention_(forward_mma16|backward_kv_ds|backward_q_ds|forward_wgmma|backward_kv_wgmma|backward_q_wgmma)_kernel' \
      --launch-count 3 "$ATTN_BENCH" "${attn_args[@]}"
    rows16=$OUTF rows16_rc=$RC
    run_step "ncu" 90 env GPT_ATTENTION_WGMMA=0 GPT_ATTENTION_FWD_ROWS=32 GPT_ATTENTION_BWD_BLOCKS=2 "$ncu_bin" "${ncu_args[@]}" \
      --kernel-name regex:'attention_(forward|backward_kv|backward_q)_mma_' \
      --launch-count 3 "$ATTN_BENCH" "${attn_args[@]}"
    cat "$OUTF" "$rows16" > "$LOGDIR/ncu_attention.txt" 2> /dev/null
    [ "$rows16_rc" = 0 ] || RC=$rows16_rc
    # One line per kernel: its name, then the figures that say what bounds it.
    ncu_tail=$(awk '/attention_(forward|backward_kv|backward_q)_(mma|mma16|ds|wgmma)_kernel[<(]/ {
        match($0, /attention_[a-z_]+_(mma|mma16|ds|wgmma)_kernel(<[0-9, ]+>)?/); print "  " substr($0, RSTART, RLENGTH) }
      /Duration|Registers Per Thread|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued/ {
        n = $NF; $NF = ""; sub(/^ +/, ""); print "      " $0 n }
      /highest-utilized pipeline|cycles being stalled/ {  # the rules naming the busiest pipe and the main stall
        line = $0; sub(/^ *[A-Z]+ +/, "", line); print "      " substr(line, 1, 110) }' "$OUTF" "$rows16" | head -n 80)
    if [ "$RC" = 0 ] && [ -n "$ncu_tail" ]; then record PASS "ncu attention kernels" "$T" "$LOGDIR/ncu_attention.txt"
    else fail_or_skip "ncu attention kernels"; fi
  fi
fi

echo
if [ -n "$ncu_tail" ]; then echo "--- ncu (attention kernels, GPT-2 124M's shape):"; echo "$ncu_tail"; echo; fi
if [ -n "$bench_tail" ]; then echo "--- bench:"; echo "$bench_tail"; echo; fi
if [ -n "$attn_tail" ]; then echo "--- attention:"; echo "$attn_tail"; echo; fi
{
  echo "GPU check summary: $gpus GPU(s) visible, ${SECONDS}s, $([ -n "$tarball" ] && echo "bundle $tarball" || echo "built in ${BUILD:-?}"); full log $LOG"
  printf '  %s\n' "${summary[@]}"
  echo "RESULT: $([ "$fail" = 0 ] && echo OK || echo FAILED)"
} | tee -a "$LOG"
exit $fail
