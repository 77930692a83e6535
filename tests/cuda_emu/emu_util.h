// Helpers for the emulated-kernel tests: device-like buffers (exact size, 256-byte aligned as cudaMalloc,
// NaN-poisoned so an output element a kernel never writes shows up), comparisons, random fills.
#pragma once

#include <cuda_runtime.h>  // the emulator's shim: emu_grid_cap

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace gpt::emu_test {

template <class T>
struct Buf {
  void* raw = nullptr;
  T* p = nullptr;
  size_t n = 0;
  // `off` elements past a 256-byte boundary (a misaligned tensor inside a bigger buffer).
  explicit Buf(size_t n_, size_t off = 0) : n(n_) {
    const size_t bytes = ((n + off) * sizeof(T) + 255) / 256 * 256 + 256;
    raw = std::aligned_alloc(256, bytes);
    if (raw == nullptr) std::abort();
    p = static_cast<T*>(raw) + off;
    poison();
  }
  ~Buf() { std::free(raw); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  void poison() {
    if constexpr (std::is_floating_point_v<T>) {
      std::fill(p, p + n, static_cast<T>(NAN));
    } else {
      std::memset(static_cast<void*>(p), 0xCD, n * sizeof(T));
    }
  }
  T& operator[](size_t i) { return p[i]; }
  const T& operator[](size_t i) const { return p[i]; }
  void fill(T v) { std::fill(p, p + n, v); }
  void copy_from(const Buf& o) { std::memcpy(static_cast<void*>(p), o.p, n * sizeof(T)); }
  bool same(const Buf& o) const { return n == o.n && std::memcmp(p, o.p, n * sizeof(T)) == 0; }
};

// Lowers grid_for's block cap for the scope, so grid-stride loops take more than one trip.
struct GridCap {
  int64_t saved = emu_grid_cap;
  explicit GridCap(int64_t cap) { emu_grid_cap = cap; }
  ~GridCap() { emu_grid_cap = saved; }
};

inline std::mt19937& rng() {
  static std::mt19937 g(1234);
  return g;
}
inline void randn(Buf<float>& b, float s = 1.0f) {
  std::normal_distribution<float> nd(0.0f, s);
  for (size_t i = 0; i < b.n; ++i) b[i] = nd(rng());
}

// max |a - b| over max |b| (or max |a - b| when b is all zero), the count of non-finite a, and the
// relative l2 error.
struct Cmp {
  double err = 0, mag = 0, l2 = 0, l2ref = 0;
  long nonfinite = 0;
  double rel() const { return mag > 0 ? err / mag : err; }
  double rel_l2() const { return l2ref > 0 ? std::sqrt(l2 / l2ref) : std::sqrt(l2); }
};
template <class A, class B>
Cmp compare(const A* a, const B* b, size_t n) {
  Cmp c;
  for (size_t i = 0; i < n; ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(x)) ++c.nonfinite;
    const double d = std::isfinite(x) ? std::abs(x - y) : INFINITY;
    c.err = std::max(c.err, d);
    c.mag = std::max(c.mag, std::abs(y));
    c.l2 += d * d;
    c.l2ref += y * y;
  }
  return c;
}
inline long count_nonfinite(const float* p, size_t n) {
  long k = 0;
  for (size_t i = 0; i < n; ++i) k += !std::isfinite(p[i]);
  return k;
}

}  // namespace gpt::emu_test
