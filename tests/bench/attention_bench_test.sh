#!/usr/bin/env bash
# scripts/bench/attention_bench on the CPU backend, tiny shapes: it runs, times and checks each pass (fp32, and bf16
# tensors read widened), its `wrong` column fires when an output is spoiled, and bad arguments get exit status 2
# with a message. Then (the second argument) the same program with --device cuda on the CUDA emulator: every kernel
# choice passes its check at head sizes 32, 64 and 128. (The CUDA kernels' numbers come from
# scripts/bench/attention_vs_pytorch.sh on a GPU.)
set -uo pipefail
bench="$1"
emu="${2:-}"
fail=0
small=(--device cpu --batch 2 --seq 48 --heads 2 --iters 2 --warmup 1)
expect() {  # expect LABEL STATUS PATTERN CMD...: CMD exits with STATUS and prints a line matching PATTERN
  local label=$1 status=$2 pattern=$3 out rc
  shift 3
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" != "$status" ] || ! grep -qE -- "$pattern" <<< "$out"; then
    echo "FAIL: $label: exit $rc (expected $status), output:"; echo "$out" | sed 's/^/  | /'; fail=1
  else
    echo "ok: $label: $(grep -E -- "$pattern" <<< "$out" | head -1)"
  fi
}
expect "fp32" 0 'kernel=auto fwd_ms=[0-9.]+ bwd_ms=[0-9.]+ .*out_err=[0-9.e+-]+ dqkv_err=[0-9.e+-]+ wrong=0' \
  "$bench" "${small[@]}" --embd 32 --dtype fp32
expect "bf16 with dropout" 0 'kernel=auto .* wrong=0' "$bench" "${small[@]}" --embd 32 --dtype bf16 --dropout 0.1
expect "two kernels" 0 'kernel=auto .* wrong=0' "$bench" "${small[@]}" --embd 32 --dtype fp32 --kernels auto,auto
expect "spoiled output" 1 'kernel=auto .* wrong=1' env GPT_TRAIN_FAULT=attention_bench_wrong \
  "$bench" "${small[@]}" --embd 32 --dtype fp32
expect "embd not a multiple of heads" 2 'embd a multiple of heads' "$bench" "${small[@]}" --embd 33
expect "unknown dtype" 2 "dtype: expected bf16 or fp32, got 'fp16'" "$bench" "${small[@]}" --embd 32 --dtype fp16
expect "unknown option" 2 'unrecognized|not expected|--bogus' "$bench" "${small[@]}" --embd 32 --bogus 1
expect "unknown kernel" 2 "kernels: expected one of auto\|wmma, got 'flash'" "$bench" "${small[@]}" --embd 32 --kernels flash
expect "wmma on the cpu" 2 'kernel wmma: ' "$bench" "${small[@]}" --embd 32 --kernels wmma
expect "no kernels" 2 "kernels: expected a comma-separated list" "$bench" "${small[@]}" --embd 32 --kernels ,
expect "dropout nan" 2 '0 <= dropout < 1' "$bench" "${small[@]}" --embd 32 --dropout nan
if [ -n "$emu" ]; then
  cuda=(--device cuda --iters 1 --warmup 0 --batch 2 --heads 2)
  expect "emulated cuda bf16, head size 64: auto" 0 'kernel=auto .* wrong=0' "$emu" "${cuda[@]}" --seq 80 --embd 128
  expect "emulated cuda bf16, head size 64: wmma" 0 'kernel=wmma .* wrong=0' "$emu" "${cuda[@]}" --seq 80 --embd 128
  expect "emulated cuda bf16, head size 32, dropout" 0 'kernel=wmma .* wrong=0' "$emu" "${cuda[@]}" --seq 40 \
    --embd 64 --dropout 0.1
  expect "emulated cuda bf16, head size 128" 0 'kernel=wmma .* wrong=0' "$emu" "${cuda[@]}" --seq 33 --embd 256
  expect "emulated cuda fp32" 0 'kernel=auto .* wrong=0' "$emu" "${cuda[@]}" --seq 50 --embd 64 --dtype fp32
  expect "emulated cuda bf16, head size 48" 2 'head size 48: the tensor-core kernels take 32, 64 or 128' "$emu" \
    "${cuda[@]}" --seq 20 --embd 96
  expect "emulated cuda, spoiled" 1 'kernel=auto .* wrong=1' env GPT_TRAIN_FAULT=attention_bench_wrong \
    "$emu" "${cuda[@]}" --seq 40 --embd 64 --kernels auto
  # scripts/bench/attention_vs_pytorch.sh's variant rows (ENV_VARIANTS), each checked: exit 3 where only the PyTorch
  # side fails (no torch, or no GPU for it), 1 when a variant's kernels are wrong.
  versus=(env ATTN_BENCH="$emu" DEVICE=cuda DTYPE=bf16 SHAPES=1,130,128,2 ITERS=1 WARMUP=0 BACKENDS=default
          bash "$(dirname "$0")/../../scripts/bench/attention_vs_pytorch.sh")
  expect "attention_vs_pytorch, variant rows" 3 'gpt-train auto:WG2=1\+BQ=64 .* ok$' env \
    ENV_VARIANTS="GPT_ATTENTION_WGMMA_OVERLAP=1;GPT_ATTENTION_WGMMA_WG2=1 GPT_ATTENTION_WGMMA_BQ=64" "${versus[@]}"
  expect "attention_vs_pytorch, a wrong variant" 1 'gpt-train auto:GPT_TRAIN_FAULT=attention_bench_wrong .* WRONG$' \
    env ENV_VARIANTS="GPT_TRAIN_FAULT=attention_bench_wrong" "${versus[@]}"
fi
[ "$fail" = 0 ] && echo "PASS" || echo "FAILED"
exit $fail
