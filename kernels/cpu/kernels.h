// CPU kernels: the free functions behind CpuBackend, one op family per file (forward and backward side by
// side). Shapes and accumulation rules are those of backend/backend.h. Parallel with OpenMP using static
// schedules and per-thread partial sums reduced in thread order, so results are deterministic for a
// given thread count.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace gpt::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
// bf16 tables, read widened (the fp32 overload on their widened values, bit for bit).
void embedding_forward(float* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

// out's (and dout's) rows are ld elements apart, ld >= OC (the overloads without it: OC); the forward writes no
// column past OC, the backward reads none.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC,
                    int64_t ld);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC, int64_t ld);
// matmul_backward's dbias alone: dbias(OC) += the column sums of dout's N rows.
void bias_backward(float* dbias, const float* dout, int64_t N, int OC, int64_t ld);
inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                           int OC) {
  matmul_forward(out, inp, weight, bias, N, C, OC, OC);
}
inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                            const float* weight, int64_t N, int C, int OC) {
  matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, OC);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int C);
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C);
void residual_layernorm_forward(float* res_out, float* out, float* mean, float* rstd, const float* res,
                                const float* inp, const float* weight, const float* bias, int64_t N, int C,
                                const DropoutMask& drop);

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, const DropoutMask& drop);
// Rows [t0, T) of attention_forward's output for one sequence, no dropout (Backend::attention_forward_rows).
void attention_forward_rows(float* out, const float* qkv, int T, int t0, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        const DropoutMask& drop);

void gelu_forward(float* out, const float* inp, int64_t N);
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N);

void residual_forward(float* out, const float* res, const float* inp, int64_t N, const DropoutMask& drop);
// Elements [first, first + n) of residual_forward (pointers at element `first`): one row of the fused op.
void residual_span(float* out, const float* res, const float* inp, int64_t first, int64_t n, const DropoutMask& drop);
void dropout_forward(float* x, int64_t N, const DropoutMask& drop);
void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop);

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss);

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int64_t step);
double sum_squares(const float* x, int64_t n);
// src rounded to bf16 (nearest even, or stochastically with the bits of element i at model index index + i).
void round_to_bf16(bf16* dst, const float* src, int64_t n, uint64_t index, const Bf16Rounding& rounding);
// Backend::adamw_update_spans and sum_squares_spans: adamw_update and sum_squares span by span.
void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                        const std::vector<OptimSpan>& spans, const AdamWStep& s, const Bf16Rounding& rounding);
double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans);

}  // namespace gpt::cpu
