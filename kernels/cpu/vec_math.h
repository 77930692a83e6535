// Vectorisable float math for the CPU kernels. glibc's expf/tanhf are only vectorised under -ffast-math,
// which we do not use (it would change NaN/Inf semantics everywhere); these are plain arithmetic without
// branches (every value is computed, then selected), so `#pragma omp simd` loops calling them vectorise.
// Accuracy: exp within 1e-7 relative over [-87, 88]; tanh within 3e-7 relative.
#pragma once

#include <bit>
#include <cstdint>

namespace gpt::cpu {

// e^x (Cephes-style): x = n ln2 + r, |r| <= ln2/2, degree-6 polynomial for e^r, 2^n by exponent bits.
// Saturates to 0 below -87.3 and to +inf above 88.7.
#pragma omp declare simd
inline float fast_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float lo = -87.3f, hi = 88.7f;
  const float xc = x < lo ? lo : (x > hi ? hi : x);
  const float n = __builtin_floorf(xc * kLog2e + 0.5f);
  const float r = xc - n * kLn2Hi - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  const float y = er * scale;
  const float below = x < lo ? 0.0f : y;
  return x > hi ? __builtin_inff() : below;
}

// tanh(x): a Taylor series below |x| = 0.25 (where 1 - 2/(e^2x + 1) would cancel), that form above.
#pragma omp declare simd
inline float fast_tanh(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float x2 = ax * ax;
  const float series =
      ax * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835)))));
  const float expo = 1.0f - 2.0f / (fast_exp(2.0f * ax) + 1.0f);
  const float t = ax < 0.25f ? series : expo;
  return x < 0.0f ? -t : t;
}

}  // namespace gpt::cpu
