// Fused softmax + cross-entropy (+ its gradient) over rows of logits; padded vocab columns [V, Vp) get
// zero probability and zero gradient.
#include <cmath>

#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vec_math.h"

namespace gpt::cpu {

void crossentropy_forward_backward(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* z = logits + i * Vp;
    float maxv = -INFINITY;
    for (int j = 0; j < V; ++j) maxv = std::max(maxv, z[j]);
    // In double: ~50k float terms summed in a few SIMD lanes would lose ~1e-5 relative (GPT-2's vocab).
    double sum_d = 0.0;
#pragma omp simd reduction(+ : sum_d)
    for (int j = 0; j < V; ++j) sum_d += static_cast<double>(fast_exp(z[j] - maxv));
    const float lse = maxv + static_cast<float>(std::log(sum_d));
    const int y = targets[i];
    losses[i] = lse - z[y];
    if (dlogits != nullptr) {
      float* dz = dlogits + i * Vp;
      const float inv = static_cast<float>(1.0 / sum_d);
#pragma omp simd
      for (int j = 0; j < V; ++j) dz[j] = fast_exp(z[j] - maxv) * inv * dloss;
      dz[y] -= dloss;
      for (int j = V; j < Vp; ++j) dz[j] = 0.0f;
    }
  }
}

}  // namespace gpt::cpu
