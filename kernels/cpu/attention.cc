// Causal multi-head self-attention, one (batch, head) pair per task, each as small GEMMs (oneDNN sgemm,
// single-threaded inside the task) plus a causal softmax:
//   S = scale * Q K^T,  P = softmax(S) over t2 <= t (zero above the diagonal),  O = drop(P) V.
// att(B,NH,T,T) keeps P (before dropout) for backward. Attention dropout's mask element is
// ((b*NH + h)*T + t)*T + t2 offset by drop.base, recomputed in backward from the counter-based RNG.
#include <dnnl.h>

#include <cmath>
#include <vector>

#include "core/check.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace gpt::cpu {

namespace {

void sgemm(char ta, char tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float* C, int64_t ldc) {
  GPT_CHECK(dnnl_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc) == dnnl_success);
}

// P with dropout applied (P * mask / (1 - p)) into dst; rows are T long.
void apply_dropout(float* dst, const float* att, int T, uint64_t first, const DropoutMask& drop) {
  const float keep = 1.0f / (1.0f - drop.p);
  for (int64_t i = 0; i < static_cast<int64_t>(T) * T; ++i) {
    dst[i] = drop.rng.uniform(drop.base + first + i) < drop.p ? 0.0f : att[i] * keep;
  }
}

// A row of T scores (position t's) in place: the softmax over [0, t], zero after it.
void causal_softmax(float* row, int t, int T) {
  float maxv = -INFINITY;
  for (int t2 = 0; t2 <= t; ++t2) maxv = std::max(maxv, row[t2]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int t2 = 0; t2 <= t; ++t2) {
    row[t2] = fast_exp(row[t2] - maxv);
    sum += row[t2];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int t2 = 0; t2 <= t; ++t2) row[t2] *= inv;
  for (int t2 = t + 1; t2 < T; ++t2) row[t2] = 0.0f;
}

// Per-thread T x T scratch, grown once and then reused (no allocation in the step loop).
float* scratch(int slot, int64_t n) {
  thread_local std::vector<float> buf[2];
  if (static_cast<int64_t>(buf[slot].size()) < n) buf[slot].resize(n);
  return buf[slot].data();
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH, const DropoutMask& drop) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + static_cast<int64_t>(b) * T * C3 + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const uint64_t first = (static_cast<uint64_t>(b) * NH + h) * T * T;
      float* p = att + first;
      sgemm('N', 'T', T, T, hs, scale, q, C3, k, C3, p, T);
      for (int t = 0; t < T; ++t) causal_softmax(p + static_cast<int64_t>(t) * T, t, T);
      const float* pd = p;
      if (drop.active()) {
        float* d = scratch(0, static_cast<int64_t>(T) * T);
        apply_dropout(d, p, T, first, drop);
        pd = d;
      }
      sgemm('N', 'N', T, hs, T, 1.0f, pd, T, v, C3, out + static_cast<int64_t>(b) * T * C + h * hs, C);
    }
  }
}

// The same per head for query rows [t0, T) only: S is (T - t0) x T, row r seeing keys [0, t0 + r].
void attention_forward_rows(float* out, const float* qkv, int T, int t0, int C, int NH) {
  GPT_CHECK(0 <= t0 && t0 < T);
  const int hs = C / NH, R = T - t0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
#pragma omp parallel for schedule(static)
  for (int h = 0; h < NH; ++h) {
    const float* q = qkv + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* p = scratch(0, static_cast<int64_t>(R) * T);
    sgemm('N', 'T', R, T, hs, scale, q + t0 * C3, C3, k, C3, p, T);
    for (int r = 0; r < R; ++r) causal_softmax(p + static_cast<int64_t>(r) * T, t0 + r, T);
    sgemm('N', 'N', R, hs, T, 1.0f, p, T, v, C3, out + h * hs, C);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C, int NH,
                        const DropoutMask& drop) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const float keep = drop.active() ? 1.0f / (1.0f - drop.p) : 1.0f;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t off = static_cast<int64_t>(b) * T * C3 + h * hs;
      const float* q = qkv + off;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + off;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* dy = dout + static_cast<int64_t>(b) * T * C + h * hs;
      const uint64_t first = (static_cast<uint64_t>(b) * NH + h) * T * T;
      const float* p = att + first;
      float* dp = scratch(1, static_cast<int64_t>(T) * T);
      // dV = drop(P)^T dO; dP' = dO V^T.
      const float* pd = p;
      if (drop.active()) {
        float* d = scratch(0, static_cast<int64_t>(T) * T);
        apply_dropout(d, p, T, first, drop);
        pd = d;
      }
      sgemm('T', 'N', T, hs, T, 1.0f, pd, T, dy, C, dv, C3);
      sgemm('N', 'T', T, T, hs, 1.0f, dy, C, v, C3, dp, T);
      // Through the dropout mask and the softmax: dS = P * (dP - sum_j P_j dP_j) * scale, causal.
      for (int t = 0; t < T; ++t) {
        const float* prow = p + static_cast<int64_t>(t) * T;
        float* drow = dp + static_cast<int64_t>(t) * T;
        if (drop.active()) {
          for (int t2 = 0; t2 <= t; ++t2) {
            drow[t2] = drop.rng.uniform(drop.base + first + static_cast<uint64_t>(t) * T + t2) < drop.p
                           ? 0.0f
                           : drow[t2] * keep;
          }
        }
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int t2 = 0; t2 <= t; ++t2) dot += prow[t2] * drow[t2];
#pragma omp simd
        for (int t2 = 0; t2 <= t; ++t2) drow[t2] = prow[t2] * (drow[t2] - dot) * scale;
        for (int t2 = t + 1; t2 < T; ++t2) drow[t2] = 0.0f;
      }
      // dQ = dS K; dK = dS^T Q.
      sgemm('N', 'N', T, hs, T, 1.0f, dp, T, k, C3, dq, C3);
      sgemm('T', 'N', T, hs, T, 1.0f, dp, T, q, C3, dk, C3);
    }
  }
}

}  // namespace gpt::cpu
