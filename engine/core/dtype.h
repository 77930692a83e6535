// Element types of tensors and buffers. bf16 is stored as its upper 16 bits of an fp32 (round to nearest
// even on conversion), so CPU code really stores and communicates bf16 and computes through fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

#include "core/host_device.h"

namespace gpt {

enum class DType : uint8_t { kF32, kBF16, kI32, kU16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kU16:
      return 2;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kI32:
      return "i32";
    case DType::kU16:
      return "u16";
  }
  return "?";
}

struct bf16 {
  uint16_t bits;
};

inline float bf16_to_f32(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Stochastic rounding of the fp32 bits u to bf16 with random bits r (the low 16 are used): r is added below
// the kept bits, which are then truncated, so the magnitude rounds up with probability (discarded bits) / 2^16
// and the expected value is u's. Infinities stay; NaN stays NaN.
GPT_HOST_DEVICE inline uint16_t bf16_bits_stochastic(uint32_t u, uint32_t r) {
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// The bf16 bits of the fp32 bits u rounded to nearest, ties to even; NaN stays a (quiet) NaN. The one rounding
// of every cast, on the CPU and in the CUDA kernels.
GPT_HOST_DEVICE inline uint16_t bf16_bits_nearest(uint32_t u) {
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline bf16 f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return bf16{bf16_bits_nearest(u)};
}

}  // namespace gpt
