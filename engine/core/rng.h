// Counter-based random numbers (Philox4x32-10, Salmon et al. 2011). A value is a pure function of
// (key, counter): no state, so init and dropout depend only on (seed, parameter or layer, element index),
// never on the order of calls, the memory layout or the number of ranks, and a recomputed forward
// reproduces the same dropout mask.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "core/host_device.h"  // CUDA kernels draw dropout masks with the very same functions as the CPU

namespace gpt {

// Philox4x32-10 on c[4] in place, key k0:k1.
GPT_HOST_DEVICE inline void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, n3 = static_cast<uint32_t>(p0);
    c[0] = n0;
    c[1] = n1;
    c[2] = n2;
    c[3] = n3;
    k0 += kW0;
    k1 += kW1;
  }
}

struct Philox {
  using Counter = std::array<uint32_t, 4>;
  using Key = std::array<uint32_t, 2>;

  static Counter generate(Counter ctr, Key key) {
    philox4x32_10(ctr.data(), key[0], key[1]);
    return ctr;
  }
};

// A stream of random numbers addressed by (seed, stream id, index). stream ids name what they are for:
// a parameter's init, a layer's dropout at a step, the data loader's batch.
class CounterRng {
 public:
  GPT_HOST_DEVICE CounterRng(uint64_t seed, uint64_t stream) : seed_(seed), stream_(stream) {}

  // Four independent 32-bit words for block `index`.
  Philox::Counter block(uint64_t index) const {
    return Philox::generate({static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32),
                             static_cast<uint32_t>(stream_), static_cast<uint32_t>(stream_ >> 32)},
                            {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
  }
  GPT_HOST_DEVICE uint32_t u32(uint64_t i) const {
    const uint64_t b = i / 4;
    uint32_t c[4] = {static_cast<uint32_t>(b), static_cast<uint32_t>(b >> 32), static_cast<uint32_t>(stream_),
                     static_cast<uint32_t>(stream_ >> 32)};
    philox4x32_10(c, static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32));
    const uint32_t w = static_cast<uint32_t>(i % 4);  // selects, not c[w]: keeps c in registers on a GPU
    return w == 0 ? c[0] : (w == 1 ? c[1] : (w == 2 ? c[2] : c[3]));
  }
  uint64_t u64(uint64_t i) const {
    auto b = block(i / 2);
    return i % 2 ? (static_cast<uint64_t>(b[2]) << 32 | b[3]) : (static_cast<uint64_t>(b[0]) << 32 | b[1]);
  }
  // Uniform in [0, 1) with 24 bits: the i-th element.
  GPT_HOST_DEVICE float uniform(uint64_t i) const { return static_cast<float>(u32(i) >> 8) * (1.0f / 16777216.0f); }
  // Standard normal for element i (Box-Muller on the two halves of one 4-word block).
  float normal(uint64_t i) const {
    auto b = block(i);
    const double u1 = (static_cast<double>(b[0] >> 8) + 1.0) * (1.0 / 16777217.0);  // (0, 1]
    const double u2 = static_cast<double>(b[1] >> 8) * (1.0 / 16777216.0);
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }

 private:
  uint64_t seed_, stream_;
};

// A 64-bit FNV-1a hash, for turning names ("block.3.attn.qkv.weight") into stream ids.
constexpr uint64_t hash_name(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

}  // namespace gpt
