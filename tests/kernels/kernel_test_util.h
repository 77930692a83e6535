// Helpers for the CPU kernel tests: seeded random tensors and a finite-difference gradient check in the
// spirit of ggml's test-backend-ops gradient mode. Kernels run in fp32; losses are summed in double.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/rng.h"

namespace gpt::testing {

// n standard normals times `scale`, reproducible from `stream`.
inline std::vector<float> randn(size_t n, uint64_t stream, float scale = 1.0f) {
  const CounterRng rng(1234, stream);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = scale * rng.normal(i);
  return x;
}

inline std::vector<int32_t> rand_tokens(size_t n, int vocab, uint64_t stream) {
  const CounterRng rng(1234, stream);
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>(rng.u32(i) % vocab);
  return t;
}

// sum(w * y) in double: the scalar L whose gradient w.r.t. y is w.
inline double weighted_sum(const std::vector<float>& w, const std::vector<float>& y) {
  REQUIRE(w.size() == y.size());
  double s = 0.0;
  for (size_t i = 0; i < w.size(); ++i) s += static_cast<double>(w[i]) * y[i];
  return s;
}

struct GradTolerance {
  double abs = 2e-4;
  double rel = 2e-3;
};

// Checks analytic = dL/dx against central differences of loss() in EVERY element of x. loss() must read x
// (which is perturbed in place and restored). The step is the fp32-representable one actually taken.
inline void check_gradient(const std::string& name, std::vector<float>& x, const std::vector<float>& analytic,
                           const std::function<double()>& loss, float eps = 1e-2f, GradTolerance tol = {}) {
  REQUIRE(analytic.size() == x.size());
  int bad = 0;
  double worst = 0.0;  // largest |num - ana| / allowed, for tuning tolerances
  for (size_t i = 0; i < x.size(); ++i) {
    const float orig = x[i], xp = orig + eps, xm = orig - eps;
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = orig;
    const double numeric = (lp - lm) / (static_cast<double>(xp) - xm);
    const double ana = analytic[i];
    const double allowed = tol.abs + tol.rel * std::max(std::abs(numeric), std::abs(ana));
    const double err = std::abs(numeric - ana);
    worst = std::max(worst, err / allowed);
    if (!(err <= allowed) && ++bad <= 5) WARN(name << "[" << i << "]: analytic " << ana << " numeric " << numeric);
  }
  INFO(name << ": " << bad << " of " << x.size() << " elements off; worst error/allowed " << worst);
  CHECK(bad == 0);
}

}  // namespace gpt::testing
