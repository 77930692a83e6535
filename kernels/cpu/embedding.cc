// Token + position embedding. Backward is deterministic without atomics: threads own slices of the
// channel dimension and walk the tokens in order, so repeated tokens add up in a fixed order.
#include <algorithm>

#include <omp.h>

#include "kernels/cpu/kernels.h"

namespace gpt::cpu {

namespace {

inline float as_f32(float x) { return x; }
inline float as_f32(bf16 x) { return bf16_to_f32(x); }

// The tables in fp32 or bf16 (read widened: the sums are those of the widened fp32 tables, bit for bit).
template <typename W>
void embedding_forward_impl(float* out, const int32_t* tokens, const W* wte, const W* wpe, int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t row = static_cast<int64_t>(b) * T + t;
      const W* te = wte + static_cast<int64_t>(tokens[row]) * C;
      const W* pe = wpe + static_cast<int64_t>(t) * C;
      float* o = out + row * C;
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = as_f32(te[c]) + as_f32(pe[c]);
    }
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C) {
  embedding_forward_impl(out, tokens, wte, wpe, B, T, C);
}
void embedding_forward(float* out, const int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C) {
  embedding_forward_impl(out, tokens, wte, wpe, B, T, C);
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
    const int chunk = (C + nt - 1) / nt;
    const int lo = std::min(C, tid * chunk), hi = std::min(C, lo + chunk);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const int64_t row = static_cast<int64_t>(b) * T + t;
        const float* d = dout + row * C;
        float* te = dwte + static_cast<int64_t>(tokens[row]) * C;
        float* pe = dwpe + static_cast<int64_t>(t) * C;
#pragma omp simd
        for (int c = lo; c < hi; ++c) {
          te[c] += d[c];
          pe[c] += d[c];
        }
      }
    }
  }
}

}  // namespace gpt::cpu
