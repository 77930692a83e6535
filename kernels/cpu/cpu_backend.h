// CpuBackend: the Backend on host memory, forwarding to the kernels in kernels/cpu. Under bf16 compute (for
// tests of the model's mixed-precision path) the GEMMs multiply their inputs rounded to bf16 in fp32, and bf16
// outputs are the fp32 results rounded; the roundings go through staging buffers that grow to the largest
// request (the first step sizes them).
#pragma once

#include "backend/backend.h"

namespace gpt {

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Buffer alloc(size_t bytes, MemCategory category) override { return Buffer(bytes, category); }
  void set_threads(int threads) override;
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void set_compute_dtype(DType type) override;
  DType compute_dtype() const override { return compute_dtype_; }

  void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B, int T,
                         int C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) override;
  using Backend::matmul_backward;  // the unpadded overloads
  using Backend::matmul_forward;
  void matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                      int OC, int64_t ld_out) override;
  void matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                       ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) override;
  void bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) override;
  void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                         ConstTensorPtr bias, int64_t N, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                          ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                          bf16* dinp_lo) override;
  void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                  ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                                  const DropoutMask& drop) override;
  int64_t attention_state_floats(int B, int T, int NH) const override {
    return static_cast<int64_t>(B) * NH * T * T;  // the probabilities
  }
  void attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                         const DropoutMask& drop) override;
  void attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* att,
                          int B, int T, int C, int NH, const DropoutMask& drop, float* dqkv_bias) override;
  void attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) override;
  void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) override;
  void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) override;
  void residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N, const DropoutMask& drop) override;
  void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) override;
  void dropout_forward(float* x, int64_t N, const DropoutMask& drop) override;
  void crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits, const int32_t* targets,
                                     int64_t N, int V, int Vp, float dloss) override;
  void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale, int64_t step) override;
  void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                          const std::vector<OptimSpan>& spans, const AdamWStep& step,
                          const Bf16Rounding& rounding) override;
  double sum_squares(const float* x, int64_t n) override;
  double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) override;
  void round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                           const Bf16Rounding& rounding) override;
  void fill_zero(float* x, int64_t n) override;
  void cast_to_bf16(bf16* dst, const float* src, int64_t n) override;
  void cast_from_bf16(float* dst, const bf16* src, int64_t n) override;
  void copy(float* dst, const float* src, int64_t n) override;

 private:
  // Staging buffer `slot` of at least n floats (0: GEMM input or a LayerNorm weight, 1: GEMM weight or a LayerNorm
  // bias, 2: an output gradient (a GEMM's, or a bf16 one the LayerNorm, attention or GELU backward reads widened) or
  // a bf16 residual term read widened, 3: an output, 4: a GEMM bias).
  float* staging(int slot, int64_t n);
  // x's values as a bf16 GEMM reads them (bf16 expanded, or fp32 rounded to bf16), as fp32 in staging `slot`.
  const float* bf16_operand(int slot, ConstTensorPtr x, int64_t n);
  // x as fp32: x itself, or a bf16 x widened into staging `slot`.
  const float* f32_view(int slot, ConstTensorPtr x, int64_t n);
  // Where an op writes its fp32 result for `out`: out itself, or staging 3 when out is bf16 (then finish()).
  float* result_area(TensorPtr out, int64_t n);
  void finish(TensorPtr out, int64_t n);

  DType compute_dtype_ = DType::kF32;
  Buffer staging_[5];  // workspace
};

}  // namespace gpt
