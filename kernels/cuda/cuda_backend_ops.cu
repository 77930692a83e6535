// The CudaBackend's ops (cuda_backend.cu has its lifecycle, memory, transfers and profile): each times itself when
// profiling, picks a kernel or GEMM path, and launches on the backend's stream.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>

#include "comm/device_select.h"
#include "core/logging.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/switches.h"
#include "kernels/cuda/workspace.h"

namespace gpt {

namespace {

// A tensor's element size in bytes.
int64_t esize(ConstTensorPtr t) { return static_cast<int64_t>(dtype_size(t.dtype)); }

// The elements the spans cover.
int64_t span_elements(const std::vector<OptimSpan>& spans) {
  int64_t n = 0;
  for (const OptimSpan& s : spans) n += s.length;
  return n;
}

}  // namespace

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B,
                                    int T, int C) {
  const OpTimer timed = time_op("embedding_forward", byte_work(int64_t{B} * T * C * (4 + esize(wte)) +
                                                               int64_t{T} * C * esize(wpe) + int64_t{B} * T * 4));
  cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, stream_);
}
void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                     int C) {
  const OpTimer timed = time_op("embedding_backward", byte_work(int64_t{B} * T * (4 * C + 4) + 2 * int64_t{T} * C * 4));
  cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, scratch(cuda::embedding_backward_scratch_bytes(B, T)),
                           stream_);
}
// Under bf16 compute the GEMM's inputs are bf16: bf16 operands (the model's LayerNorm and GELU outputs, and the
// weights when the ParamSource holds them in bf16) go in as they are; fp32 ones are cast into the cast areas.
const bf16* CudaBackend::gemm_input(int slot, ConstTensorPtr x, int64_t n) {
  if (x.is_bf16()) return x.as_bf16();
  bf16* area = cast_area(slot, n);
  cuda::cast_to_bf16(area, x.as_f32(), n, stream_);
  return area;
}
// The bias in the output's dtype, as Matmul adds it (cuBLASLt's bias epilogue takes a vector of D's type): the
// bias itself when it is so (a bf16 one 16-byte aligned, as the epilogue needs: Matmul adds an unaligned fp32 one
// with a kernel), else rounded, widened or copied into cast area 3 (cudaMalloc'd, so aligned).
const void* CudaBackend::gemm_bias(ConstTensorPtr bias, DType out_type, int OC) {
  if (bias.data == nullptr) return nullptr;
  const bool aligned = reinterpret_cast<uintptr_t>(bias.data) % 16 == 0;
  if (bias.dtype == out_type && (out_type == DType::kF32 || aligned)) return bias.data;
  if (out_type == DType::kBF16) {
    bf16* area = cast_area(3, OC);
    if (bias.is_bf16()) {
      GPT_CUDA_CHECK(cudaMemcpyAsync(area, bias.data, OC * sizeof(bf16), cudaMemcpyDeviceToDevice, stream_));
    } else {
      cuda::cast_to_bf16(area, bias.as_f32(), OC, stream_);
    }
    return area;
  }
  auto* area = reinterpret_cast<float*>(cast_area(3, 2 * static_cast<int64_t>(OC)));  // OC floats
  cuda::cast_from_bf16(area, bias.as_bf16(), OC, stream_);
  return area;
}
void CudaBackend::matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias,
                                 int64_t N, int C, int OC, int64_t ld_out) {
  const OpTimer timed = time_op("matmul_forward", flop_work(2.0 * N * C * OC), {N, C, OC});
  if (compute_dtype_ == DType::kF32) {
    matmul_->forward(out.as_f32(), DType::kF32, inp.as_f32(), weight.as_f32(), DType::kF32,
                     gemm_bias(bias, DType::kF32, OC), N, C, OC, ld_out);
    return;
  }
  const bf16* a = gemm_input(0, inp, N * C);
  const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
  matmul_->forward(out.data, out.dtype, a, w, DType::kBF16, gemm_bias(bias, out.dtype, OC), N, C, OC, ld_out);
}
void CudaBackend::matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                                  ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) {
  const OpTimer timed = time_op(
      "matmul_backward", flop_work(2.0 * N * C * OC * ((dinp.data != nullptr) + (dweight != nullptr))), {N, C, OC});
  void* s = dbias != nullptr ? scratch(cuda::bias_backward_scratch_bytes(N, OC)) : nullptr;
  if (compute_dtype_ == DType::kF32) {
    matmul_->backward(dinp.as_f32(), dweight, dbias, dout.as_f32(), inp.as_f32(), weight.as_f32(), DType::kF32, N, C,
                      OC, ld_dout, s);
    return;
  }
  const bf16* a = gemm_input(0, inp, N * C);
  const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
  const bf16* d = gemm_input(2, dout, N * ld_dout);
  matmul_->backward(dinp, dweight, dbias, d, a, w, DType::kBF16, N, C, OC, ld_dout, s);  // dbias sums the bf16 d
}
void CudaBackend::bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) {
  if (N == 0) return;
  const OpTimer timed = time_op("bias_backward", byte_work(N * OC * esize(dout)));
  // As matmul_backward takes dout: under bf16 compute its bf16 rounding.
  const ConstTensorPtr d =
      compute_dtype_ == DType::kF32 ? ConstTensorPtr(dout.as_f32()) : ConstTensorPtr(gemm_input(2, dout, N * OC));
  cuda::bias_backward(dbias, d, N, OC, OC, scratch(cuda::bias_backward_scratch_bytes(N, OC)), stream_);
}
bool CudaBackend::gelu_fused(GeluFusion level, int64_t rows, std::initializer_list<ConstTensorPtr> gelu_tensors) const {
  if (static_cast<int>(gelu_fusion_) < static_cast<int>(level) || compute_dtype_ != DType::kBF16) return false;
  if (!cuda::Matmul::gelu_fusable(rows)) return false;
  for (const ConstTensorPtr& t : gelu_tensors) {
    if (!t.is_bf16() || reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  }
  return true;
}
bool CudaBackend::gelu_backward_fused(int C) const {
  return gelu_fusion_ == GeluFusion::kFull && compute_dtype_ == DType::kBF16 && cuda::Matmul::gelu_fusable(C);
}
void CudaBackend::matmul_gelu_forward(TensorPtr pre, TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight,
                                      ConstTensorPtr bias, int64_t N, int C, int OC) {
  if (!gelu_fused(GeluFusion::kForward, OC, {pre, out})) {
    Backend::matmul_gelu_forward(pre, out, inp, weight, bias, N, C, OC);
    return;
  }
  const OpTimer timed = time_op("matmul_gelu_forward", flop_work(2.0 * N * C * OC), {N, C, OC});
  const bf16* a = gemm_input(0, inp, N * C);
  const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
  const auto* b = static_cast<const bf16*>(gemm_bias(bias, DType::kBF16, OC));
  matmul_->forward_gelu(out.as_bf16(), pre.as_bf16(), a, w, b, N, C, OC);
}
void CudaBackend::matmul_backward_gelu(TensorPtr dpre, float* dpre_bias, TensorPtr dinp, float* dweight, float* dbias,
                                       ConstTensorPtr dout, ConstTensorPtr inp, ConstTensorPtr weight,
                                       ConstTensorPtr pre, int64_t N, int C, int OC) {
  if (!gelu_fused(GeluFusion::kFull, C, {dpre, pre})) {
    // The fc bias's gradient summed by the GELU backward as it stores dpre, where dpre is what matmul_backward would
    // take (its dtype the compute dtype): bias_backward of it, bit for bit (column_partials' order either way).
    if (dpre_bias == nullptr || dpre.dtype != compute_dtype_ || dinp.data == nullptr || N == 0) {
      Backend::matmul_backward_gelu(dpre, dpre_bias, dinp, dweight, dbias, dout, inp, weight, pre, N, C, OC);
      return;
    }
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    const OpTimer timed = time_op("gelu_backward_bias", byte_work(N * C * (esize(dpre) + esize(pre) + esize(dinp))));
    cuda::gelu_backward_bias(dpre, dpre_bias, pre, dinp, N, C, scratch(cuda::bias_backward_scratch_bytes(N, C)),
                             stream_);
    return;
  }
  bool summed = false;  // dpre_bias, by the DGELU GEMM's epilogue
  {
    const OpTimer timed =
        time_op("matmul_backward_gelu", flop_work(2.0 * N * C * OC * (1 + (dweight != nullptr))), {N, C, OC});
    void* s = dbias != nullptr || dpre_bias != nullptr ? scratch(cuda::Matmul::backward_dgelu_scratch_bytes(N, C, OC))
                                                       : nullptr;
    const bf16* a = gemm_input(0, inp, N * C);
    const bf16* w = gemm_input(1, weight, static_cast<int64_t>(OC) * C);
    const bf16* d = gemm_input(2, dout, N * OC);
    summed = matmul_->backward_dgelu(dpre.as_bf16(), pre.as_bf16(), dpre_bias, dweight, dbias, d, a, w, N, C, OC, s);
  }
  // Timed on its own (a timed op inside another is left out); unless the DGELU GEMM's epilogue summed it
  // (GPT_GEMM_DGELU_BGRAD=1, an experiment).
  if (dpre_bias != nullptr && !summed) bias_backward(dpre_bias, dpre, N, C);
}
void CudaBackend::layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                                    ConstTensorPtr bias, int64_t N, int C) {
  const OpTimer timed =
      time_op("layernorm_forward", byte_work(N * C * (4 + esize(out)) + 8 * N + 2 * int64_t{C} * esize(weight)));
  cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream_);
}
void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                                     ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                                     bf16* dinp_lo) {
  const OpTimer timed = time_op(
      "layernorm_backward",
      byte_work(N * C * (12 + esize(dout) + (dinp_lo != nullptr ? 2 : 0)) + 8 * N + int64_t{C} * (esize(weight) + 16)));
  cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, dinp_lo,
                           scratch(cuda::layernorm_backward_scratch_bytes(N, C)), stream_);
}
void CudaBackend::residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                             ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N,
                                             int C, const DropoutMask& drop) {
  const OpTimer timed = time_op("residual_layernorm_forward", byte_work(N * C * (8 + esize(inp) + esize(out)) + 8 * N +
                                                                        2 * int64_t{C} * esize(weight)));
  cuda::residual_layernorm_forward(res_out, out, mean, rstd, res, inp, weight, bias, N, C, drop, stream_);
}
// Under bf16 compute, the tensor-core kernels for the head sizes they cover and 16-byte aligned tensors (they
// move 16 bytes at a time): the mma.sync ones (attention_mma.cu) where every tensor but dout is bf16 and
// run.attention_kernel is auto, else the WMMA ones (attention_tc.cu); else the fp32 kernels.
CudaBackend::AttentionPath CudaBackend::attention_path(int C, int NH, std::initializer_list<ConstTensorPtr> tensors,
                                                       const void* dout) const {
  if (compute_dtype_ != DType::kBF16 || !cuda::attention_tc_supported(C, NH)) return AttentionPath::kFp32;
  if (reinterpret_cast<uintptr_t>(dout) % 16 != 0) return AttentionPath::kFp32;
  bool bf16 = true;
  for (const ConstTensorPtr& t : tensors) {
    if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return AttentionPath::kFp32;
    bf16 = bf16 && t.is_bf16();
  }
  // The kernels asked for, then those that fit this GPU's shared memory per block (the mma.sync ones take 102 KB at
  // head size 128, over the 99 KB of sm_86/sm_89; the WMMA ones 77.5 KB; the fp32 ones 73 KB).
  const bool mma = attention_kernel_ == AttentionKernel::kAuto && bf16 && cuda::attention_mma_supported(C, NH);
  const size_t mma_bytes = mma ? cuda::attention_mma_smem_bytes(C, NH) : 0;
  if (mma && mma_bytes <= smem_per_block_) return AttentionPath::kMma;
  const size_t tc_bytes = cuda::attention_tc_smem_bytes(C, NH);
  const AttentionPath path = tc_bytes <= smem_per_block_ ? AttentionPath::kWmma : AttentionPath::kFp32;
  if (!attention_fallback_logged_ && (mma || path == AttentionPath::kFp32)) {
    attention_fallback_logged_ = true;
    char msg[256];
    std::snprintf(msg, sizeof(msg),
                  "attention at head size %d: the %s kernels take %zu bytes of shared memory per block, this GPU "
                  "allows %zu: running the %s kernels",
                  C / NH, mma ? "mma.sync" : "WMMA", mma ? mma_bytes : tc_bytes, smem_per_block_,
                  path == AttentionPath::kWmma ? "WMMA" : "fp32");
    log_warning(msg);
  }
  return path;
}
void CudaBackend::attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                                    const DropoutMask& drop) {
  const OpTimer timed = time_op("attention_forward", flop_work(2.0 * B * T * T * C));
  switch (attention_path(C, NH, {out, qkv})) {
    case AttentionPath::kMma:
      cuda::attention_forward_mma(out, att, qkv, B, T, C, NH, drop, stream_);
      break;
    case AttentionPath::kWmma:
      cuda::attention_forward_tc(out, att, qkv, B, T, C, NH, drop, stream_);
      break;
    case AttentionPath::kFp32:
      cuda::attention_forward(out, att, qkv, B, T, C, NH, drop, stream_);
      break;
  }
}
void CudaBackend::attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out,
                                     const float* att, int B, int T, int C, int NH, const DropoutMask& drop,
                                     float* dqkv_bias) {
  const OpTimer timed = time_op("attention_backward", flop_work(5.0 * B * T * T * C));
  bool bias_summed = false;  // by the wgmma kernels (sm_90), as they store dqkv
  const AttentionPath path = attention_path(C, NH, {dqkv, qkv, out}, dout.data);
  // The tensor-core kernels take dO in bf16 (the model's is: the projection GEMM's input gradient), for D as well; an
  // fp32 one (tests, fp32 callers) is rounded into cast area 0 first, as a GEMM input would be (grown on use), so the
  // mma.sync and WMMA kernels give the same bits for either.
  const bf16* dob = path != AttentionPath::kFp32 ? gemm_input(0, dout, int64_t{B} * T * C) : nullptr;
  switch (path) {
    case AttentionPath::kMma:
      bias_summed = cuda::attention_backward_mma(
          dqkv, dob, qkv, out, att, B, T, C, NH, drop, dqkv_bias,
          scratch(cuda::attention_backward_mma_scratch_bytes(B, T, C, NH, drop.active())), stream_);
      break;
    case AttentionPath::kWmma:
      cuda::attention_backward_tc(dqkv, dob, qkv, out, att, B, T, C, NH, drop,
                                  scratch(cuda::attention_backward_scratch_bytes(B, T, C, NH)), stream_);
      break;
    case AttentionPath::kFp32:
      cuda::attention_backward(dqkv, dout, qkv, out, att, B, T, C, NH, drop,
                               scratch(cuda::attention_backward_scratch_bytes(B, T, C, NH)), stream_);
      break;
  }
  // Otherwise matmul_backward's kernel, bit for bit (the scratch is free again: stream order).
  if (dqkv_bias != nullptr && !bias_summed) bias_backward(dqkv_bias, dqkv, int64_t{B} * T, 3 * C);
}
// Sampling's attention over its KV cache: one simple kernel for every dtype and head size (no tensor cores).
void CudaBackend::attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) {
  const OpTimer timed = time_op("attention_forward_rows", flop_work(4.0 * (T - t0) * T * C));
  cuda::attention_forward_rows(out, qkv, T, t0, C, NH, stream_);
}
void CudaBackend::gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) {
  const OpTimer timed = time_op("gelu_forward", byte_work(N * (esize(inp) + esize(out))));
  cuda::gelu_forward(out, inp, N, stream_);
}
void CudaBackend::gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) {
  const OpTimer timed = time_op("gelu_backward", byte_work(N * (esize(dinp) + esize(inp) + esize(dout))));
  cuda::gelu_backward(dinp, inp, dout, N, stream_);
}
void CudaBackend::residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N,
                                   const DropoutMask& drop) {
  const OpTimer timed = time_op("residual_forward", byte_work((8 + esize(inp)) * N));
  cuda::residual_forward(out, res, inp, N, drop, stream_);
}
void CudaBackend::dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) {
  const OpTimer timed = time_op("dropout_backward", byte_work(drop.active() || dinp != dout ? 8 * N : 0));
  cuda::dropout_backward(dinp, dout, N, drop, stream_);
}
void CudaBackend::dropout_forward(float* x, int64_t N, const DropoutMask& drop) {
  const OpTimer timed = time_op("dropout_forward", byte_work(drop.active() ? 8 * N : 0));  // inactive: nothing runs
  cuda::dropout_forward(x, N, drop, stream_);
}
void CudaBackend::crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits,
                                                const int32_t* targets, int64_t N, int V, int Vp, float dloss) {
  const OpTimer timed = time_op(
      "crossentropy_forward_backward",
      byte_work(N * V * esize(logits) + (dlogits.data != nullptr ? N * int64_t{Vp} * esize(dlogits) : 0) + 8 * N));
  cuda::crossentropy_forward_backward(losses, dlogits, logits, targets, N, V, Vp, dloss, stream_);
}
void CudaBackend::adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
  const OpTimer timed = time_op("adamw_update", byte_work(28 * n));
  cuda::adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step, stream_);
}
double CudaBackend::sum_squares(const float* x, int64_t n) {
  const OpTimer timed = time_op("sum_squares", byte_work(4 * n));
  cuda::sum_squares(result_.as<double>(), x, n, scratch(cuda::sum_squares_scratch_bytes()), stream_);
  GPT_CUDA_CHECK(cudaMemcpyAsync(result_host_, result_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *result_host_;
}
void CudaBackend::adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                                     const std::vector<OptimSpan>& spans, const AdamWStep& step,
                                     const Bf16Rounding& rounding) {
  const OpTimer timed =
      time_op("adamw_update_spans", byte_work(span_elements(spans) * (28 + (param_lo != nullptr ? 2 : 0))));
  cuda::adamw_update_spans(param, m, v, grad, param_lo, span_table(spans), step, rounding, stream_);
}
double CudaBackend::sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) {
  const OpTimer timed = time_op("sum_squares_spans", byte_work(4 * span_elements(spans)));
  const cuda::SpanTable& t = span_table(spans);
  cuda::sum_squares_spans(result_.as<double>(), x, t, scratch(cuda::sum_squares_spans_scratch_bytes(t)), stream_);
  GPT_CUDA_CHECK(cudaMemcpyAsync(result_host_, result_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *result_host_;
}
void CudaBackend::round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                                      const Bf16Rounding& rounding) {
  const OpTimer timed = time_op("round_to_bf16_spans", byte_work(6 * span_elements(spans)));
  cuda::round_to_bf16_spans(dst, src, span_table(spans), rounding, stream_);
}
void CudaBackend::fill_zero(float* x, int64_t n) {
  const OpTimer timed = time_op("fill_zero", byte_work(4 * n));
  if (n > 0) GPT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
}
void CudaBackend::cast_to_bf16(bf16* dst, const float* src, int64_t n) {
  const OpTimer timed = time_op("cast_to_bf16", byte_work(6 * n));
  cuda::cast_to_bf16(dst, src, n, stream_);
}
void CudaBackend::cast_from_bf16(float* dst, const bf16* src, int64_t n) {
  const OpTimer timed = time_op("cast_from_bf16", byte_work(6 * n));
  cuda::cast_from_bf16(dst, src, n, stream_);
}
void CudaBackend::copy(float* dst, const float* src, int64_t n) {
  const OpTimer timed = time_op("copy", byte_work(8 * n));
  if (n > 0) GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace gpt
