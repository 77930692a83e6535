#!/usr/bin/env bash
# scripts/bench/by_kind.py: gpt-train's per-op table (as GPT_TRAIN_CUDA_PROFILE logs it) and PyTorch's PROF lines
# (real kernel names of cuBLAS, flash attention, Triton and fused AdamW) sorted into kinds, per step; and the note
# when PyTorch printed no profile.
set -uo pipefail
by_kind="$(cd "$(dirname "$0")/../.." && pwd)/scripts/bench/by_kind.py"
work=$(mktemp -d /tmp/by-kind.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/ours.log" <<'LOG'
[12:00:00.000] [rank 0] [info] CUDA op time (GPT_TRAIN_CUDA_PROFILE=1; events before and after each op, ops back to back):
    op                                 total ms    calls    ms/call      %  least work/call           rate
    matmul_backward                      100.00      200     0.5000  50.0%      154.6 GFLOP  309.2 TFLOP/s
    attention_backward                    40.00       48     0.8333  20.0%      123.7 GFLOP  148.4 TFLOP/s
    matmul_forward_16384_768_3072         30.00      100     0.3000  15.0%      77.31 GFLOP  257.7 TFLOP/s
    crossentropy_forward_backward         10.00        4     2.5000   5.0%         3298 MB      1319 GB/s
    adamw_update_spans                     8.00        4     2.0000   4.0%         3480 MB      1740 GB/s
    layernorm_backward                    12.00      100     0.1200   6.0%        201.4 MB      1678 GB/s
    total                                200.00
LOG
cat > "$work/torch.log" <<'LOG'
RESULT {"tokens_per_s": 1}
PROF steps=4 total_ms=90.000 calls=300 name=sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64
PROF steps=4 total_ms=30.000 calls=48 name=void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>(params)
PROF steps=4 total_ms=8.000 calls=4 name=triton_red_fused__log_softmax_nll_loss_0
PROF steps=4 total_ms=6.000 calls=8 name=void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>
PROF steps=4 total_ms=10.000 calls=50 name=triton_per_fused_native_layer_norm_add_1
PROF end
LOG
out=$(python3 "$by_kind" "$work/ours.log" "$work/torch.log" 4 2>&1)
echo "$out"
fail=0
for want in 'GEMMs \(with their epilogues\) +32\.50 +22\.50 +0\.69' 'attention +10\.00 +7\.50 +0\.75' \
    'cross-entropy +2\.50 +2\.00 +0\.80' 'optimizer \(AdamW, norm, clip\) +2\.00 +1\.50 +0\.75' \
    'the rest \(LayerNorm, GELU, residual, embedding, casts\) +3\.00 +2\.50 +0\.83' 'total +50\.00 +36\.00 +0\.72'; do
  grep -qE "$want" <<< "$out" || { echo "FAIL: no line matching: $want"; fail=1; }
done
grep -q 'cut short' <<< "$out" && { echo "FAIL: a complete profile called cut short"; fail=1; }
# PyTorch's kernels, largest first, per step: the GEMM's 90 ms over 4 steps first, the cross-entropy's 8 after the
# layer norm's 10.
grep -qE '^ +22\.500 \(75\)  sm90_xmma_gemm' <<< "$out" || { echo "FAIL: no largest-kernel line for the GEMM"; fail=1; }
[ "$(grep -E '^ +[0-9.]+ \([0-9.]+\)  triton_(per|red)_fused' <<< "$out" | grep -oE 'layer_norm|log_softmax' |
    tr '\n' ' ')" = "layer_norm log_softmax " ] ||
  { echo "FAIL: largest kernels not sorted"; fail=1; }
# A layout copy Inductor names after SDPA is not attention; a cut-short profile says so.
head -n 4 "$work/torch.log" > "$work/cut.log"
echo 'PROF steps=4 total_ms=4.000 calls=8 name=triton_poi_fused__scaled_dot_product_flash_attention_3' >> "$work/cut.log"
out=$(python3 "$by_kind" "$work/ours.log" "$work/cut.log" 4 2>&1)
echo "$out"
grep -qE 'attention +10\.00 +7\.50 ' <<< "$out" || { echo "FAIL: the Triton copy counted as attention"; fail=1; }
grep -q 'cut short' <<< "$out" || { echo "FAIL: a profile without PROF end not called cut short"; fail=1; }
out=$(python3 "$by_kind" "$work/ours.log" "$work/ours.log" 4 2>&1)
grep -q 'no by-kind comparison: no PyTorch kernel profile' <<< "$out" || { echo "FAIL: without PROF lines: $out"; fail=1; }
[ "$fail" = 0 ] && echo PASS || echo FAILED
exit $fail
