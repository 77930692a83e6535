// Residual adds with dropout, dropout itself, and reductions used by the optimizer.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace gpt::cpu {

// Elements [first, first + n) of the residual add: out = res + dropout(inp), the mask indexed by `first + i`.
// Not inlined (nor cloned or folded: noipa): residual_forward and the fused residual_layernorm_forward run this one
// body, so the compiler's choices (vectorisation, FMA contraction of inp * keep into the add) are the same for both,
// bit for bit.
[[gnu::noipa]] void residual_span(float* out, const float* res, const float* inp, int64_t first, int64_t n,
                                  const DropoutMask& drop) {
  if (!drop.active()) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = res[i] + inp[i];
    return;
  }
  const float keep = 1.0f / (1.0f - drop.p);
  const uint64_t base = drop.base + static_cast<uint64_t>(first);
  for (int64_t i = 0; i < n; ++i) out[i] = res[i] + (drop.rng.uniform(base + i) < drop.p ? 0.0f : inp[i] * keep);
}

void residual_forward(float* out, const float* res, const float* inp, int64_t N, const DropoutMask& drop) {
  constexpr int64_t kSpan = 4096;  // elements per call: large enough that the call costs nothing
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < N; s += kSpan) {
    residual_span(out + s, res + s, inp + s, s, std::min(kSpan, N - s), drop);
  }
}

void dropout_forward(float* x, int64_t N, const DropoutMask& drop) {
  if (!drop.active()) return;
  const float keep = 1.0f / (1.0f - drop.p);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) x[i] = drop.rng.uniform(drop.base + i) < drop.p ? 0.0f : x[i] * keep;
}

void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) {
  if (!drop.active()) {
    if (dinp != dout) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < N; ++i) dinp[i] = dout[i];
    }
    return;
  }
  const float keep = 1.0f / (1.0f - drop.p);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) dinp[i] = drop.rng.uniform(drop.base + i) < drop.p ? 0.0f : dout[i] * keep;
}

double sum_squares(const float* x, int64_t n) {
  // Fixed-size blocks summed in block order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
  thread_local std::vector<double> partial;
  partial.assign(nblocks, 0.0);
  double* const parts = partial.data();  // the calling thread's vector, shared with the workers
#pragma omp parallel for schedule(static)
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const int64_t lo = blk * kBlock, hi = std::min(n, lo + kBlock);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * x[i];
    parts[blk] = s;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int64_t step) {
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

void round_to_bf16(bf16* dst, const float* src, int64_t n, uint64_t index, const Bf16Rounding& rounding) {
  if (!rounding.stochastic) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &src[i], 4);
    dst[i].bits = bf16_bits_stochastic(u, rounding.rng.u32(index + static_cast<uint64_t>(i)));
  }
}

void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                        const std::vector<OptimSpan>& spans, const AdamWStep& s, const Bf16Rounding& rounding) {
  for (const OptimSpan& sp : spans) {
    const int64_t b = sp.begin;
    adamw_update(param + b, m + b, v + b, grad + b, sp.length, s.lr, s.beta1, s.beta2, s.eps,
                 sp.decay ? s.weight_decay : 0.0f, s.grad_scale, s.step);
    if (param_lo != nullptr) round_to_bf16(param_lo + b + sp.lo_shift, param + b, sp.length, sp.index, rounding);
  }
}

double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) {
  double total = 0.0;
  for (const OptimSpan& sp : spans) total += sum_squares(x + sp.begin, sp.length);
  return total;
}

}  // namespace gpt::cpu
