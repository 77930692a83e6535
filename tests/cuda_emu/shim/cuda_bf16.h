// Emulated __nv_bfloat16: storage only, conversions round to nearest even (as __float2bfloat16).
#pragma once
#include <bit>
#include <cstdint>
struct __nv_bfloat16 { uint16_t x; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.x) << 16); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16(a), __float2bfloat16(b)}; }
