#include "kernels/cpu/cpu_backend.h"

#include <omp.h>

#include <cstring>
#include <thread>

#include "kernels/cpu/kernels.h"

namespace gpt {

void CpuBackend::set_threads(int threads) {
  omp_set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
}

void CpuBackend::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
void CpuBackend::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B,
                                   int T, int C) {
  GPT_CHECK(wte.dtype == wpe.dtype);
  if (wte.is_bf16()) {
    cpu::embedding_forward(out, tokens, wte.as_bf16(), wpe.as_bf16(), B, T, C);
  } else {
    cpu::embedding_forward(out, tokens, wte.as_f32(), wpe.as_f32(), B, T, C);
  }
}
void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                    int C) {
  cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
}
void CpuBackend::set_compute_dtype(DType type) {
  GPT_CHECK(type == DType::kF32 || type == DType::kBF16);
  compute_dtype_ = type;
}

float* CpuBackend::staging(int slot, int64_t n) {
  Buffer& b = staging_[slot];
  if (b.bytes() < static_cast<size_t>(n) * sizeof(float))
    b = alloc(static_cast<size_t>(n) * sizeof(float), MemCategory::kWorkspace);
  return b.as<float>();
}

const float* CpuBackend::bf16_operand(int slot, ConstTensorPtr x, int64_t n) {
  float* dst = staging(slot, n);
  if (x.is_bf16()) {
    const bf16* src = x.as_bf16();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    const float* src = x.as_f32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
  }
  return dst;
}

const float* CpuBackend::f32_view(int slot, ConstTensorPtr x, int64_t n) {
  return x.is_bf16() ? bf16_operand(slot, x, n) : x.as_f32();
}

float* CpuBackend::result_area(TensorPtr out, int64_t n) { return out.is_bf16() ? staging(3, n) : out.as_f32(); }

void CpuBackend::finish(TensorPtr out, int64_t n) {
  if (!out.is_bf16()) return;
  cast_to_bf16(out.as_bf16(), staging_[3].as<float>(), n);
}

void CpuBackend::matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias,
                                int64_t N, int C, int OC, int64_t ld_out) {
  if (compute_dtype_ == DType::kF32) {
    cpu::matmul_forward(out.as_f32(), inp.as_f32(), weight.as_f32(), f32_view(4, bias, OC), N, C, OC, ld_out);
    return;
  }
  const float* a = bf16_operand(0, inp, N * C);
  const float* w = bf16_operand(1, weight, static_cast<int64_t>(OC) * C);
  // A bf16 output takes the bias rounded to bf16, as the CUDA backend's bias epilogue does.
  const float* b = out.is_bf16() && bias.data != nullptr ? bf16_operand(4, bias, OC) : f32_view(4, bias, OC);
  cpu::matmul_forward(result_area(out, N * ld_out), a, w, b, N, C, OC, ld_out);
  finish(out, N * ld_out);
}
void CpuBackend::matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                                 ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) {
  if (compute_dtype_ == DType::kF32) {
    cpu::matmul_backward(dinp.as_f32(), dweight, dbias, dout.as_f32(), inp.as_f32(), weight.as_f32(), N, C, OC,
                         ld_dout);
    return;
  }
  const float* a = bf16_operand(0, inp, N * C);
  const float* w = bf16_operand(1, weight, static_cast<int64_t>(OC) * C);
  const float* d = bf16_operand(2, dout, N * ld_dout);
  float* di = dinp.data != nullptr ? result_area(dinp, N * C) : nullptr;
  cpu::matmul_backward(di, dweight, dbias, d, a, w, N, C, OC, ld_dout);  // dbias from the bf16 values, as on CUDA
  if (di != nullptr) finish(dinp, N * C);
}
void CpuBackend::bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) {
  const int64_t n = N * OC;
  const float* d = compute_dtype_ == DType::kF32 ? dout.as_f32() : bf16_operand(2, dout, n);
  cpu::bias_backward(dbias, d, N, OC, OC);
}
void CpuBackend::layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                                   ConstTensorPtr bias, int64_t N, int C) {
  cpu::layernorm_forward(result_area(out, N * C), mean, rstd, inp, f32_view(0, weight, C), f32_view(1, bias, C), N, C);
  finish(out, N * C);
}
void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                                    ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                                    bf16* dinp_lo) {
  cpu::layernorm_backward(dinp, dweight, dbias, f32_view(2, dout, N * C), inp, f32_view(0, weight, C), mean, rstd, N,
                          C);
  if (dinp_lo != nullptr) cast_to_bf16(dinp_lo, dinp, N * C);
}
void CpuBackend::residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                            ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N,
                                            int C, const DropoutMask& drop) {
  cpu::residual_layernorm_forward(res_out, result_area(out, N * C), mean, rstd, res, f32_view(2, inp, N * C),
                                  f32_view(0, weight, C), f32_view(1, bias, C), N, C, drop);
  finish(out, N * C);
}
void CpuBackend::attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                                   const DropoutMask& drop) {
  const int64_t n = static_cast<int64_t>(B) * T * C;
  cpu::attention_forward(result_area(out, n), att, f32_view(0, qkv, 3 * n), B, T, C, NH, drop);
  finish(out, n);
}
// The probabilities in `att` give the backward; it does not read out.
void CpuBackend::attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr /*out*/,
                                    const float* att, int B, int T, int C, int NH, const DropoutMask& drop,
                                    float* dqkv_bias) {
  const int64_t n = static_cast<int64_t>(B) * T * 3 * C;
  cpu::attention_backward(result_area(dqkv, n), f32_view(2, dout, n / 3), f32_view(0, qkv, n), att, B, T, C, NH, drop);
  finish(dqkv, n);
  if (dqkv_bias != nullptr) bias_backward(dqkv_bias, dqkv, static_cast<int64_t>(B) * T, 3 * C);
}
void CpuBackend::attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) {
  const int64_t n = static_cast<int64_t>(T - t0) * C;
  cpu::attention_forward_rows(result_area(out, n), f32_view(0, qkv, 3 * static_cast<int64_t>(T) * C), T, t0, C, NH);
  finish(out, n);
}
void CpuBackend::gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) {
  cpu::gelu_forward(result_area(out, N), f32_view(0, inp, N), N);
  finish(out, N);
}
void CpuBackend::gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) {
  cpu::gelu_backward(result_area(dinp, N), f32_view(0, inp, N), f32_view(2, dout, N), N);
  finish(dinp, N);
}
void CpuBackend::residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N,
                                  const DropoutMask& drop) {
  cpu::residual_forward(out, res, f32_view(2, inp, N), N, drop);
}
void CpuBackend::dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) {
  cpu::dropout_backward(dinp, dout, N, drop);
}
void CpuBackend::dropout_forward(float* x, int64_t N, const DropoutMask& drop) { cpu::dropout_forward(x, N, drop); }
void CpuBackend::crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits,
                                               const int32_t* targets, int64_t N, int V, int Vp, float dloss) {
  // bf16 logits are widened first (so in place is safe: the kernel reads the widened copy). Staging slot 0 grows to
  // the logits' N * Vp floats; bf16 compute on the CPU is for the tests (the trainer computes in fp32 here).
  const float* z = f32_view(0, logits, N * Vp);
  if (!dlogits.is_bf16()) {  // fp32, or none
    cpu::crossentropy_forward_backward(losses, dlogits.as_f32(), z, targets, N, V, Vp, dloss);
    return;
  }
  cpu::crossentropy_forward_backward(losses, result_area(dlogits, N * Vp), z, targets, N, V, Vp, dloss);
  finish(dlogits, N * Vp);
}
void CpuBackend::adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                              float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
  cpu::adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step);
}
double CpuBackend::sum_squares(const float* x, int64_t n) { return cpu::sum_squares(x, n); }
void CpuBackend::fill_zero(float* x, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] = 0.0f;
}
void CpuBackend::adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                                    const std::vector<OptimSpan>& spans, const AdamWStep& step,
                                    const Bf16Rounding& rounding) {
  cpu::adamw_update_spans(param, m, v, grad, param_lo, spans, step, rounding);
}
double CpuBackend::sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) {
  return cpu::sum_squares_spans(x, spans);
}
void CpuBackend::round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                                     const Bf16Rounding& rounding) {
  for (const OptimSpan& sp : spans) {
    cpu::round_to_bf16(dst + sp.begin + sp.lo_shift, src + sp.begin, sp.length, sp.index, rounding);
  }
}
void CpuBackend::cast_to_bf16(bf16* dst, const float* src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}
void CpuBackend::cast_from_bf16(float* dst, const bf16* src, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}
void CpuBackend::copy(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, sizeof(float) * n); }

}  // namespace gpt
