// Backend parity (in the spirit of ggml's test-backend-ops), the helpers of tests/kernels/parity_*_test.cc: every
// Backend op runs on the CPU backend and on the CUDA backend with the same random inputs, and the results are compared;
// then a whole GPT forward and backward. Without a CUDA build or a visible GPU every case prints why it is skipped and
// passes. The CUDA emulator's test binary (tests/cuda_emu) compiles those files too, with GPT_PARITY_EMULATED: there
// the "GPU" is CudaEmuBackend (the same kernels and host code, converted), so these cases run in CPU-only CI as well.
//
// Tolerances (fp32 everywhere): errors are measured as max|cuda - cpu| / max|cpu| over the tensor (an
// element-wise relative error is meaningless for values that cancel to ~0). Element-wise ops and casts
// agree to 1e-6 (the CPU's fast_exp/fast_tanh are within 3e-7 of libm) or bit for bit; reductions (GEMMs,
// LayerNorm, softmax, attention) sum in a different order, so they agree to 1e-5 (the fp32 bound),
// which is ~100 ulps of the largest value for sums of up to a few thousand terms. The whole model step is
// held to 1e-4 on the loss and every gradient.
//
// Everything here lives in gpt::parity, inline: each parity_*_test.cc takes it with `using namespace parity`.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kernels/kernel_test_util.h"
#ifdef GPT_PARITY_EMULATED
#include "kernels/cuda/cuda_backend.h"  // the emulator's conversion: gpt::CudaEmuBackend
#endif

namespace gpt::parity {

using testing::rand_tokens;
using testing::randn;

#ifdef GPT_PARITY_EMULATED
constexpr bool kEmulated = true;  // every CUDA thread and GEMM term runs in turn: GPT-2-sized shapes are left to GPUs
#else
constexpr bool kEmulated = false;
#endif
// GPT-2-sized shapes (T 1024, the 50304-row head), on a GPU only, and not under GPT_PARITY_SMALL_SHAPES=1: under
// compute-sanitizer racecheck, which tracks every shared-memory access, one such attention call took minutes.
inline bool gpu_sized_shapes() {
  const char* small = std::getenv("GPT_PARITY_SMALL_SHAPES");
  return !kEmulated && !(small != nullptr && std::string(small) == "1");
}

// A fresh CUDA backend (in the emulator's binary, an emulated one).
inline Expected<std::unique_ptr<Backend>> make_gpu() {
#ifdef GPT_PARITY_EMULATED
  return std::unique_ptr<Backend>(std::make_unique<CudaEmuBackend>(0));
#else
  return make_backend("cuda");
#endif
}

// The CUDA backend, or null after printing why the tests skip.
inline Backend* cuda_or_skip(const char* what) {
  // Never destroyed: the CUDA runtime may unload before static destructors run.
  static auto* made = new Expected<std::unique_ptr<Backend>>(make_gpu());
  if (!*made) {
    std::printf("SKIPPED backend parity (%s): %s\n", what, made->status().message().c_str());
    return nullptr;
  }
  return (*made)->get();
}

inline Backend& cpu() {
  static std::unique_ptr<Backend> be = [] {
    auto b = std::move(*make_backend("cpu"));
    b->set_threads(2);
    return b;
  }();
  return *be;
}

// A device copy of a host vector; read() brings it back.
template <typename T>
struct Dev {
  Dev(Backend& be, const std::vector<T>& host) : be(be), n(host.size()) {
    buf = be.alloc(n * sizeof(T), MemCategory::kWorkspace);
    be.to_device(buf.data(), host.data(), n * sizeof(T));
  }
  Dev(Backend& be, size_t n) : be(be), n(n) { buf = be.alloc(n * sizeof(T), MemCategory::kWorkspace); }
  T* p() { return buf.as<T>(); }
  std::vector<T> read() {
    std::vector<T> h(n);
    be.to_host(h.data(), buf.data(), n * sizeof(T));
    return h;
  }
  Backend& be;
  size_t n;
  Buffer buf;
};

inline double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

inline void expect_close(const std::string& what, const std::vector<float>& cpu_out, const std::vector<float>& cuda_out,
                         double tol) {
  REQUIRE(cpu_out.size() == cuda_out.size());
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < cpu_out.size(); ++i) {
    const double d = std::abs(static_cast<double>(cpu_out[i]) - cuda_out[i]);
    if (!(d <= worst)) {  // also catches NaN
      worst = d;
      at = i;
    }
  }
  const double scale = std::max(max_abs(cpu_out), 1e-30);
  const double rel = worst / scale;
  INFO(what << ": max error " << worst << " at " << at << " (cpu " << cpu_out[at] << ", cuda " << cuda_out[at]
            << "), relative to max |cpu| " << scale << ": " << rel << " > " << tol);
  CHECK(rel <= tol);
}

constexpr double kElementwise = 1e-6, kReduction = 1e-5;

// x's values rounded to bf16 (nearest even), as fp32.
inline std::vector<float> rounded(std::vector<float> x) {
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  return x;
}

// A bf16 result against an fp32 reference whose own error is within e (absolute): the largest difference between
// the result and the reference rounded, over e + one bf16 place of the larger (each rounding moves a value by at
// most half a place). At most 1 when the result is right.
// `extra`, when given, adds an allowance per element.
inline double bf16_place(double x) { return std::ldexp(1.0, std::ilogb(std::max(std::abs(x), 1e-30)) - 7); }  // 8 bits
inline double bf16_ratio(float want_f32, bf16 got, double e, double extra = 0.0) {
  const double want = bf16_to_f32(f32_to_bf16(want_f32)), have = bf16_to_f32(got);
  return std::abs(have - want) / (e + bf16_place(std::max(std::abs(want), std::abs(have))) + extra);
}
inline double bf16_worst(const std::vector<float>& want_f32, const std::vector<bf16>& got, double e,
                         const std::vector<double>& extra = {}) {
  REQUIRE(want_f32.size() == got.size());
  REQUIRE((extra.empty() || extra.size() == got.size()));
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = bf16_ratio(want_f32[i], got[i], e, extra.empty() ? 0.0 : extra[i]);
    if (!(r <= worst)) worst = r;  // NaN sticks
  }
  return worst;
}

// A bf16 GEMM output with a bias epilogue, against the CPU's fp32 sum with the bf16 bias (rows of OC, ld OC). On an
// H200, cuBLASLt's kernels for outputs whose columns are not 16-byte aligned (OC not a multiple of 8, or the output
// pointer 2 bytes off) came out up to 11x the bf16_worst bound on elements where the sum and the bias nearly cancel:
// as if the product were rounded to bf16 before the bias is added (two roundings, the first at the scale of the
// product, which can be far larger than the result's). So each element is also allowed one bf16 place of its
// product before the bias, out - bias, where `unaligned` says the output is such (on aligned ones the H200's results
// held the plain bound): tight still (a missing or misplaced bias, or a wrong product, is off by O(1) of those
// places). `detail` names the worst element, and the worst ratio without the allowance and against the product with
// no bias at all, to tell these apart in the log.
struct BiasedBf16 {
  double worst = 0.0;  // with the allowance where given: at most 1 when the result is right
  std::string detail;
};
inline BiasedBf16 bf16_biased_worst(const std::vector<float>& want, const std::vector<bf16>& got,
                                    const std::vector<float>& bias16, int OC, double e, bool unaligned) {
  REQUIRE(want.size() == got.size());
  std::vector<float> no_bias(want.size());
  BiasedBf16 r;
  size_t at = 0;
  double worst_plain = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double product = static_cast<double>(want[i]) - bias16[i % static_cast<size_t>(OC)];
    no_bias[i] = static_cast<float>(product);
    const double allowed = bf16_ratio(want[i], got[i], e, unaligned ? bf16_place(product) : 0.0);
    const double plain = bf16_ratio(want[i], got[i], e);
    if (!(allowed <= r.worst)) r.worst = allowed;  // NaN sticks
    if (!(plain <= worst_plain)) worst_plain = plain, at = i;
  }
  std::ostringstream os;
  os << (unaligned ? "with one place of the product allowed " : "(aligned: no allowance) ") << r.worst << ", without "
     << worst_plain << " at " << at << " (want " << want[at] << ", got " << bf16_to_f32(got[at]) << ", product "
     << no_bias[at] << ", bias " << bias16[at % static_cast<size_t>(OC)] << "); against the product with no bias "
     << bf16_worst(no_bias, got, e);
  r.detail = os.str();
  if (worst_plain > 1.0) WARN("a bf16 GEMM output needed the allowance for its product's rounding: " << r.detail);
  return r;
}

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

inline DropoutMask mask(float p, uint64_t base = 0) {
  DropoutMask m;
  m.p = p;
  m.rng = CounterRng(99, 7);
  m.base = base;
  return m;
}

}  // namespace gpt::parity
