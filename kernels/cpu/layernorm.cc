// LayerNorm over the last dimension, fp32 statistics (eps = 1e-5 as GPT-2).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"

namespace gpt::cpu {

namespace {

constexpr float kEps = 1e-5f;

// One row. Not inlined (nor cloned: noipa), so both forward entry points run the same machine code and their results
// agree bit for bit (the simd reductions' order is the vectorisation the compiler picks for this one body).
[[gnu::noipa]] void layernorm_row(float* y, float* mean, float* rstd, const float* x, const float* weight,
                                  const float* bias, int C) {
  float m = 0.0f;
#pragma omp simd reduction(+ : m)
  for (int c = 0; c < C; ++c) m += x[c];
  m /= C;
  float var = 0.0f;
#pragma omp simd reduction(+ : var)
  for (int c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
  var /= C;
  const float s = 1.0f / std::sqrt(var + kEps);
#pragma omp simd
  for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
  if (mean) *mean = m;
  if (rstd) *rstd = s;
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    layernorm_row(out + i * C, mean ? mean + i : nullptr, rstd ? rstd + i : nullptr, inp + i * C, weight, bias, C);
  }
}

// Row by row, so the row just written is normalised while it is in cache. residual_span and layernorm_row are
// the bodies residual_forward and layernorm_forward run, so the result equals the two ops bit for bit.
void residual_layernorm_forward(float* res_out, float* out, float* mean, float* rstd, const float* res,
                                const float* inp, const float* weight, const float* bias, int64_t N, int C,
                                const DropoutMask& drop) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    float* r = res_out + i * C;
    residual_span(r, res + i * C, inp + i * C, i * C, C, drop);
    layernorm_row(out + i * C, mean ? mean + i : nullptr, rstd ? rstd + i : nullptr, r, weight, bias, C);
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C) {
  const int nt = omp_get_max_threads();
  // Per-thread partial dweight/dbias, summed in thread order afterwards: deterministic, no atomics.
  thread_local std::vector<float> partial;  // grows once, then reused: no allocation in the step loop
  partial.assign(static_cast<size_t>(nt) * 2 * C, 0.0f);
  float* const parts = partial.data();  // the calling thread's vector, shared with the workers
#pragma omp parallel num_threads(nt)
  {
    float* pw = parts + static_cast<size_t>(omp_get_thread_num()) * 2 * C;
    float* pb = pw + C;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float m = mean[i], s = rstd[i];
      float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * dy[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= C;
      dnorm_norm_mean /= C;
      float* dx = dinp + i * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        const float dnorm = weight[c] * dy[c];
        pb[c] += dy[c];
        pw[c] += norm * dy[c];
        dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
      }
    }
  }
  for (int t = 0; t < nt; ++t) {
    const float* pw = parts + static_cast<size_t>(t) * 2 * C;
    for (int c = 0; c < C; ++c) {
      dweight[c] += pw[c];
      dbias[c] += pw[C + c];
    }
  }
}

}  // namespace gpt::cpu
