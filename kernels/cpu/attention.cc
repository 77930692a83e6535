// Causal multi-head self-attention, one (batch, head) pair per task. Forward keeps the softmax
// probabilities att(B,NH,T,T) (rows above the diagonal are left untouched) for backward. Attention
// dropout is applied to the probabilities inside the weighted sum; its mask is recomputed in backward
// from the counter-based RNG, element index ((b*NH + h)*T + t)*T + t2 offset by drop.base.
#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace gpt::cpu {

namespace {
inline float keep_scale(const DropoutMask& drop, uint64_t idx) {
  if (!drop.active()) return 1.0f;
  return drop.rng.uniform(drop.base + idx) < drop.p ? 0.0f : 1.0f / (1.0f - drop.p);
}
}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                       const DropoutMask& drop) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        float* a = att + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (static_cast<int64_t>(b) * T + t2) * C3 + C + h * hs;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          dot *= scale;
          a[t2] = dot;
          maxv = std::max(maxv, dot);
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int t2 = 0; t2 <= t; ++t2) {
          a[t2] = fast_exp(a[t2] - maxv);
          sum += a[t2];
        }
        const float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; ++t2) a[t2] *= inv;
        float* o = out + (static_cast<int64_t>(b) * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0.0f;
        const uint64_t row = ((static_cast<uint64_t>(b) * NH + h) * T + t) * T;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float p = a[t2] * keep_scale(drop, row + t2);
          const float* v = qkv + (static_cast<int64_t>(b) * T + t2) * C3 + 2 * C + h * hs;
#pragma omp simd
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH, const DropoutMask& drop) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  // Each (b, h) task writes only its own head's columns of dqkv: zero them first, then accumulate.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      thread_local std::vector<float> dpre;  // grows once, then reused
      dpre.resize(T);
      for (int t = 0; t < T; ++t) {
        float* base = dqkv + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        for (int i = 0; i < hs; ++i) base[i] = base[C + i] = base[2 * C + i] = 0.0f;
      }
      for (int t = 0; t < T; ++t) {
        const float* a = att + ((static_cast<int64_t>(b) * NH + h) * T + t) * T;
        const float* dy = dout + (static_cast<int64_t>(b) * T + t) * C + h * hs;
        const uint64_t row = ((static_cast<uint64_t>(b) * NH + h) * T + t) * T;
        // dp[t2] = dy . v[t2] through the dropout mask; dv[t2] += p'[t2] * dy.
        float dot_sum = 0.0f;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float ks = keep_scale(drop, row + t2);
          const float* v = qkv + (static_cast<int64_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          float* dv = dqkv + (static_cast<int64_t>(b) * T + t2) * C3 + 2 * C + h * hs;
          const float pk = a[t2] * ks;
          float dp = 0.0f;
#pragma omp simd reduction(+ : dp)
          for (int i = 0; i < hs; ++i) {
            dp += dy[i] * v[i];
            dv[i] += pk * dy[i];
          }
          dp *= ks;
          dpre[t2] = dp;
          dot_sum += dp * a[t2];
        }
        // Softmax backward, then the scaled dot product: dq += s * dpre k, dk += s * dpre q.
        const float* q = qkv + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        float* dq = dqkv + (static_cast<int64_t>(b) * T + t) * C3 + h * hs;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float g = a[t2] * (dpre[t2] - dot_sum) * scale;
          const float* k = qkv + (static_cast<int64_t>(b) * T + t2) * C3 + C + h * hs;
          float* dk = dqkv + (static_cast<int64_t>(b) * T + t2) * C3 + C + h * hs;
#pragma omp simd
          for (int i = 0; i < hs; ++i) {
            dq[i] += g * k[i];
            dk[i] += g * q[i];
          }
        }
      }
    }
  }
}

}  // namespace gpt::cpu
