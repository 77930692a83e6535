// Backend parity (in the spirit of ggml's test-backend-ops): every Backend op runs on the CPU backend and on
// the CUDA backend with the same random inputs, and the results are compared; then a whole GPT forward and
// backward. Without a CUDA build or a visible GPU every case prints why it is skipped and passes. The CUDA
// emulator's test binary (tests/cuda_emu) compiles this file too, with GPT_PARITY_EMULATED: there the "GPU" is
// CudaEmuBackend (the same kernels and host code, converted), so these cases run in CPU-only CI as well.
//
// Tolerances (fp32 everywhere): errors are measured as max|cuda - cpu| / max|cpu| over the tensor (an
// element-wise relative error is meaningless for values that cancel to ~0). Element-wise ops and casts
// agree to 1e-6 (the CPU's fast_exp/fast_tanh are within 3e-7 of libm) or bit for bit; reductions (GEMMs,
// LayerNorm, softmax, attention) sum in a different order, so they agree to 1e-5 (the issue's fp32 bound),
// which is ~100 ulps of the largest value for sums of up to a few thousand terms. The whole model step is
// held to 1e-4 on the loss and every gradient.
#include <algorithm>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/atomic_file.h"
#include "kernels/cuda/workspace.h"
#include "kernels/kernel_test_util.h"
#include "model/activation_checkpointing.h"
#include "model/gpt.h"
#include "model/param_source.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"
#ifdef GPT_PARITY_EMULATED
#include "cublasLt.h"                   // the emulator's: emu_lt_no_dgelu_bgrad
#include "kernels/cuda/cuda_backend.h"  // the emulator's conversion: gpt::CudaEmuBackend
#endif
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
#include "kernels/mbarrier_probe.h"
#include "kernels/mma_probe.h"  // in the emulator's binary its conversion (gpt::cuda_emu)
#include "kernels/wgmma_probe.h"
#endif

namespace gpt {
namespace {

using testing::rand_tokens;
using testing::randn;

#ifdef GPT_PARITY_EMULATED
namespace cuda_probe = cuda_emu;
#elif defined(GPT_WITH_CUDA)
namespace cuda_probe = cuda;
#endif

#ifdef GPT_PARITY_EMULATED
constexpr bool kEmulated = true;  // every CUDA thread and GEMM term runs in turn: GPT-2-sized shapes are left to GPUs
#else
constexpr bool kEmulated = false;
#endif
// GPT-2-sized shapes (T 1024, the 50304-row head), on a GPU only, and not under GPT_PARITY_SMALL_SHAPES=1: under
// compute-sanitizer racecheck, which tracks every shared-memory access, one such attention call took minutes.
bool gpu_sized_shapes() {
  const char* small = std::getenv("GPT_PARITY_SMALL_SHAPES");
  return !kEmulated && !(small != nullptr && std::string(small) == "1");
}

// A fresh CUDA backend (in the emulator's binary, an emulated one).
Expected<std::unique_ptr<Backend>> make_gpu() {
#ifdef GPT_PARITY_EMULATED
  return std::unique_ptr<Backend>(std::make_unique<CudaEmuBackend>(0));
#else
  return make_backend("cuda");
#endif
}

// The CUDA backend, or null after printing why the tests skip.
Backend* cuda_or_skip(const char* what) {
  // Never destroyed: the CUDA runtime may unload before static destructors run.
  static auto* made = new Expected<std::unique_ptr<Backend>>(make_gpu());
  if (!*made) {
    std::printf("SKIPPED backend parity (%s): %s\n", what, made->status().message().c_str());
    return nullptr;
  }
  return (*made)->get();
}

Backend& cpu() {
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

double max_abs(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) m = std::max(m, static_cast<double>(std::abs(v)));
  return m;
}

void expect_close(const std::string& what, const std::vector<float>& cpu_out, const std::vector<float>& cuda_out,
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
std::vector<float> rounded(std::vector<float> x) {
  for (float& v : x) v = bf16_to_f32(f32_to_bf16(v));
  return x;
}

// A bf16 result against an fp32 reference whose own error is within e (absolute): the largest difference between
// the result and the reference rounded, over e + one bf16 place of the larger (each rounding moves a value by at
// most half a place). At most 1 when the result is right.
// `extra`, when given, adds an allowance per element.
double bf16_place(double x) { return std::ldexp(1.0, std::ilogb(std::max(std::abs(x), 1e-30)) - 7); }  // 8 bits
double bf16_ratio(float want_f32, bf16 got, double e, double extra = 0.0) {
  const double want = bf16_to_f32(f32_to_bf16(want_f32)), have = bf16_to_f32(got);
  return std::abs(have - want) / (e + bf16_place(std::max(std::abs(want), std::abs(have))) + extra);
}
double bf16_worst(const std::vector<float>& want_f32, const std::vector<bf16>& got, double e,
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
BiasedBf16 bf16_biased_worst(const std::vector<float>& want, const std::vector<bf16>& got,
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

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f32_to_bf16(x[i]);
  return out;
}

DropoutMask mask(float p, uint64_t base = 0) {
  DropoutMask m;
  m.p = p;
  m.rng = CounterRng(99, 7);
  m.base = base;
  return m;
}

// Embedding forward and backward on the CPU and on `gpu` for `tokens` (B x T of V), every fp32 tensor on the GPU
// `off` floats past its allocation (off 1: 4-byte aligned, as parameters and gradients sit at any float offset, so
// the kernels must take their scalar paths); the backward deterministic.
void compare_embedding(Backend* gpu, const std::vector<int32_t>& tokens, int B, int T, int C, int V, int off) {
  auto wte = randn(V * C, 2), wpe = randn(T * C, 3), dout = randn(B * T * C, 4);
  auto dwte = randn(V * C, 5), dwpe = randn(T * C, 6);  // non-zero: backward accumulates
  std::vector<float> out(B * T * C), c_dwte = dwte, c_dwpe = dwpe;
  cpu().embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  cpu().embedding_backward(c_dwte.data(), c_dwpe.data(), dout.data(), tokens.data(), B, T, C);

  auto pad = [off](const std::vector<float>& x) {
    std::vector<float> y(off, NAN);
    y.insert(y.end(), x.begin(), x.end());
    return y;
  };
  auto unpad = [off](const std::vector<float>& y) { return std::vector<float>(y.begin() + off, y.end()); };
  Dev<int32_t> g_tok(*gpu, tokens);
  Dev<float> g_wte(*gpu, pad(wte)), g_wpe(*gpu, pad(wpe)), g_dout(*gpu, pad(dout)),
      g_out(*gpu, pad(std::vector<float>(out.size(), NAN)));
  gpu->embedding_forward(g_out.p() + off, g_tok.p(), g_wte.p() + off, g_wpe.p() + off, B, T, C);
  expect_close("embedding out", out, unpad(g_out.read()), kElementwise);
  Dev<float> g_dwte(*gpu, pad(dwte)), g_dwpe(*gpu, pad(dwpe));
  gpu->embedding_backward(g_dwte.p() + off, g_dwpe.p() + off, g_dout.p() + off, g_tok.p(), B, T, C);
  const auto first = unpad(g_dwte.read());
  expect_close("embedding dwte", c_dwte, first, kReduction);
  expect_close("embedding dwpe", c_dwpe, unpad(g_dwpe.read()), kReduction);
  // Deterministic: the same inputs give the same bits.
  Dev<float> again(*gpu, pad(dwte)), again_pe(*gpu, pad(dwpe));
  gpu->embedding_backward(again.p() + off, again_pe.p() + off, g_dout.p() + off, g_tok.p(), B, T, C);
  REQUIRE(unpad(again.read()) == first);
}

TEST_CASE("parity: embedding forward and backward (repeated tokens)", "[cuda]") {
  Backend* gpu = cuda_or_skip("embedding");
  if (!gpu) return;
  compare_embedding(gpu, rand_tokens(3 * 17, 11, 1), 3, 17, 40, 11, 0);  // few tokens: many repeats
}

// The backward's sort and run scan at their edges: every token distinct (runs of one), one token everywhere in
// runs of exactly 256 (the scan's window) and 257, and 4-byte-aligned fp32 tensors with C a multiple of 4.
TEST_CASE("parity: embedding with distinct tokens, runs at the scan's window, unaligned tensors", "[cuda]") {
  Backend* gpu = cuda_or_skip("embedding edges");
  if (!gpu) return;
  std::vector<int32_t> distinct(64);
  for (int i = 0; i < 64; ++i) distinct[i] = (i * 37) % 64;
  compare_embedding(gpu, distinct, 1, 64, 36, 64, 1);
  compare_embedding(gpu, std::vector<int32_t>(2 * 128, 7), 2, 128, 36, 50, 0);
  compare_embedding(gpu, std::vector<int32_t>(257, 49), 1, 257, 36, 50, 0);
  compare_embedding(gpu, rand_tokens(2 * 33, 11, 8), 2, 33, 36, 11, 1);
}

TEST_CASE("parity: matmul forward and backward", "[cuda]") {
  Backend* gpu = cuda_or_skip("matmul");
  if (!gpu) return;
  struct Shape {
    int64_t N;
    int C, OC;
    bool bias, dinp;
  };
  for (const Shape s : {Shape{7, 5, 3, true, true}, Shape{64, 48, 144, true, true}, Shape{300, 96, 33, false, false},
                        Shape{1030, 128, 512, true, true}}) {
    CAPTURE(s.N, s.C, s.OC, s.bias, s.dinp);
    auto inp = randn(s.N * s.C, 10), w = randn(int64_t{s.OC} * s.C, 11), b = randn(s.OC, 12);
    auto dout = randn(s.N * s.OC, 13), dw = randn(int64_t{s.OC} * s.C, 14), db = randn(s.OC, 15);
    std::vector<float> out(s.N * s.OC), dinp(s.N * s.C), c_dw = dw, c_db = db;
    const float* bias = s.bias ? b.data() : nullptr;
    cpu().matmul_forward(out.data(), inp.data(), w.data(), bias, s.N, s.C, s.OC);
    cpu().matmul_backward(s.dinp ? dinp.data() : nullptr, c_dw.data(), s.bias ? c_db.data() : nullptr, dout.data(),
                          inp.data(), w.data(), s.N, s.C, s.OC);
    Dev<float> g_inp(*gpu, inp), g_w(*gpu, w), g_b(*gpu, b), g_dout(*gpu, dout), g_dw(*gpu, dw), g_db(*gpu, db);
    Dev<float> g_out(*gpu, out.size()), g_dinp(*gpu, dinp.size());
    gpu->matmul_forward(g_out.p(), g_inp.p(), g_w.p(), s.bias ? g_b.p() : nullptr, s.N, s.C, s.OC);
    gpu->matmul_backward(s.dinp ? g_dinp.p() : nullptr, g_dw.p(), s.bias ? g_db.p() : nullptr, g_dout.p(), g_inp.p(),
                         g_w.p(), s.N, s.C, s.OC);
    expect_close("matmul out", out, g_out.read(), kReduction);
    if (s.dinp) expect_close("matmul dinp", dinp, g_dinp.read(), kReduction);
    expect_close("matmul dweight", c_dw, g_dw.read(), kReduction);
    expect_close("matmul dbias", c_db, g_db.read(), kReduction);
  }
}

#ifndef GPT_PARITY_EMULATED  // the registry is gpt_engine's, tested once
TEST_CASE("backend registry: errors name the device, the CPU has no device communicator, GELU fusion names",
          "[backend]") {
  auto bad = make_backend("tpu");
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.status().message().find("'tpu'") != std::string::npos);
  CHECK(bad.status().message().find("cpu or cuda") != std::string::npos);
  auto single = make_single_communicator();
  auto dev = make_device_communicator(*single, cpu(), "world");
  REQUIRE_FALSE(dev.has_value());
  CHECK(dev.status().message().find("host memory") != std::string::npos);
  CHECK(*parse_gelu_fusion("none") == GeluFusion::kNone);
  CHECK(*parse_gelu_fusion("forward") == GeluFusion::kForward);
  CHECK(*parse_gelu_fusion("full") == GeluFusion::kFull);
  CHECK(parse_gelu_fusion("on").status().message() == "expected one of none|forward|full, got 'on'");
  // Built without CUDA, or no GPU: the reason is in the message (checked by the skip lines of the cases below).
  auto cuda = make_backend("cuda");
  if (!cuda) CHECK(cuda.status().message().find("device 'cuda'") != std::string::npos);
}
#endif

// bf16 GEMM inputs round to bf16 and multiply exactly on the tensor cores, accumulating in fp32; the CPU
// given the same rounded inputs in fp32 computes the same sums, so the fp32 reduction tolerance applies.
TEST_CASE("parity: bf16 matmul equals the fp32 matmul of bf16-rounded inputs", "[cuda]") {
  Backend* gpu = cuda_or_skip("bf16 matmul");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  for (const auto& [N, C, OC] : {std::tuple<int64_t, int, int>{8, 16, 24}, {1024, 768, 2304}, {333, 64, 97}}) {
    if (!gpu_sized_shapes() && N == 1024) continue;  // the qkv GEMM of GPT-2 124M, on a GPU only
    CAPTURE(N, C, OC);
    auto inp = randn(N * C, 80), w = randn(int64_t{OC} * C, 81), b = randn(OC, 82), dout = randn(N * OC, 83);
    auto dw = randn(int64_t{OC} * C, 84), db = randn(OC, 85);
    std::vector<float> out(N * OC), dinp(N * C), c_dw = dw, c_db = db;
    const auto inp16 = rounded(inp), w16 = rounded(w), dout16 = rounded(dout);
    cpu().matmul_forward(out.data(), inp16.data(), w16.data(), b.data(), N, C, OC);
    cpu().matmul_backward(dinp.data(), c_dw.data(), nullptr, dout16.data(), inp16.data(), w16.data(), N, C, OC);
    // dbias sums dout as the GEMMs take it: its bf16 values (the backend contract)
    std::vector<float> ignored_dw(c_dw.size());
    cpu().matmul_backward(nullptr, ignored_dw.data(), c_db.data(), dout16.data(), inp16.data(), w16.data(), N, C, OC);
    Dev<float> g_inp(*gpu, inp), g_w(*gpu, w), g_b(*gpu, b), g_dout(*gpu, dout), g_dw(*gpu, dw), g_db(*gpu, db);
    Dev<float> g_out(*gpu, out.size()), g_dinp(*gpu, dinp.size());
    gpu->matmul_forward(g_out.p(), g_inp.p(), g_w.p(), g_b.p(), N, C, OC);
    gpu->matmul_backward(g_dinp.p(), g_dw.p(), g_db.p(), g_dout.p(), g_inp.p(), g_w.p(), N, C, OC);
    expect_close("bf16 matmul out", out, g_out.read(), kReduction);
    expect_close("bf16 matmul dinp", dinp, g_dinp.read(), kReduction);
    expect_close("bf16 matmul dweight", c_dw, g_dw.read(), kReduction);
    expect_close("bf16 matmul dbias", c_db, g_db.read(), kReduction);
    // A bf16 output (the fc GEMM's): the same fp32 sum with the bias rounded to bf16, rounded once at the store;
    // against the CPU's result of the same, rounded. The two fp32 sums (different orders) agree within the fp32
    // reduction bound e = kReduction * max |out|, and each rounding to bf16 moves a value by at most half a bf16
    // place, so they are at most e + one place (of the larger) apart. (Not "one place": a result that cancels to
    // near 0 has places far smaller than e.)
    std::vector<float> out_lo(out.size());
    cpu().matmul_forward(out_lo.data(), inp16.data(), w16.data(), rounded(b).data(), N, C, OC);
    Dev<bf16> g_lo(*gpu, out.size());
    gpu->matmul_forward(g_lo.p(), g_inp.p(), g_w.p(), g_b.p(), N, C, OC);
    const double e = kReduction * max_abs(out_lo);
    const BiasedBf16 worst = bf16_biased_worst(out_lo, g_lo.read(), rounded(b), OC, e, /*unaligned=*/OC % 8 != 0);
    INFO("bf16 output: worst difference of its bound (fp32 bound " << e << " + one bf16 place): " << worst.detail);
    CHECK(worst.worst <= 1.0);
    // A bf16 input gradient (the projections' under bf16 compute), bounded the same way against the fp32 dinp; no
    // dweight or dbias asked.
    Dev<bf16> g_dinp_lo(*gpu, dinp.size());
    gpu->matmul_backward(g_dinp_lo.p(), nullptr, nullptr, g_dout.p(), g_inp.p(), g_w.p(), N, C, OC);
    const double ed = kReduction * max_abs(dinp);
    const double worst_d = bf16_worst(dinp, g_dinp_lo.read(), ed);
    INFO("bf16 dinp: worst difference " << worst_d << " of its bound (fp32 bound " << ed << " + one bf16 place)");
    CHECK(worst_d <= 1.0);
    expect_close("bf16 matmul dweight, once", c_dw, g_dw.read(), kReduction);  // not accumulated again
  }
  gpu->set_compute_dtype(DType::kF32);
}

// GPT_GEMM_ALGOS=4, the GEMM algorithm experiment: a fresh backend (its own per-shape cache) times up to 4 of the
// heuristic's algorithms at each shape's first call and runs the fastest: the output with its bias, the input gradient
// and the weight and bias gradients stay within the fp32 reduction bound of the CPU's. The weight gradient accumulates
// into values there before (each timed call adds to it again: saved before the timing and put back after it, else it
// would be several gradients off). (The emulator's cuBLASLt offers one algorithm; a GPU more. Every [cuda] case also
// passes with GPT_GEMM_ALGOS=4 set, checked by hand in the emulator.)
TEST_CASE("parity: GEMMs under GPT_GEMM_ALGOS=4", "[cuda]") {
  if (!cuda_or_skip("GEMM algorithm timing")) return;
  const int64_t N = 64;
  const int C = 32, OC = 48;
  const auto inp = rounded(randn(N * C, 96)), w = rounded(randn(int64_t{OC} * C, 97)), b = randn(OC, 98);
  const auto dout = rounded(randn(N * OC, 99));
  const auto dw0 = randn(int64_t{OC} * C, 100), db0 = randn(OC, 101);
  std::vector<float> out(N * OC), dinp(N * C), dw = dw0, db = db0;
  cpu().matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
  cpu().matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N, C, OC);
  ::setenv("GPT_GEMM_ALGOS", "4", 1);
  auto made = make_gpu();
  ::unsetenv("GPT_GEMM_ALGOS");
  REQUIRE(made.has_value());
  Backend& gpu = **made;
  gpu.set_compute_dtype(DType::kBF16);
  Dev<float> g_inp(gpu, inp), g_w(gpu, w), g_b(gpu, b), g_dout(gpu, dout), g_out(gpu, out.size());
  Dev<float> g_dinp(gpu, dinp.size()), g_dw(gpu, dw0), g_db(gpu, db0);
  const testing::ScopedEnv algos("GPT_GEMM_ALGOS", "4");  // read when a shape is first seen
  for (int i = 0; i < 2; ++i) {                           // the first call times, the second reuses the choice
    gpu.matmul_forward(g_out.p(), g_inp.p(), g_w.p(), g_b.p(), N, C, OC);
    expect_close("timed matmul out", out, g_out.read(), kReduction);
  }
  gpu.matmul_backward(g_dinp.p(), g_dw.p(), g_db.p(), g_dout.p(), g_inp.p(), g_w.p(), N, C, OC);
  expect_close("timed matmul dinp", dinp, g_dinp.read(), kReduction);
  expect_close("timed matmul dweight (accumulated into the values before)", dw, g_dw.read(), kReduction);
  expect_close("timed matmul dbias (accumulated into the values before)", db, g_db.read(), kReduction);
}

// GPT_GEMM_ALGO_CACHE: a backend that times its algorithms (GPT_GEMM_ALGOS=4) writes each timed shape's choice to the
// file (the forward's, the input gradient's and the weight gradient's GEMMs: three lines); the next backend, without
// GPT_GEMM_ALGOS, takes them from there (cuBLASLt's check accepts them) with the same results bit for bit, adding
// nothing. Made by name (make_cuda_backend), a backend refuses a file that is not a cache, one written for another GPU
// or cuBLASLt, or one with a line out of the format, naming the file and the line.
TEST_CASE("parity: GPT_GEMM_ALGO_CACHE keeps the timed algorithms for the next backend", "[cuda]") {
  if (!cuda_or_skip("GEMM algorithm cache")) return;
  const testing::TempDir dir;
  const std::string path = dir.file("algos.txt");
  testing::ScopedEnv cache("GPT_GEMM_ALGO_CACHE", path.c_str()), algos("GPT_GEMM_ALGOS", "4");
  const int64_t N = 64;
  const int C = 32, OC = 48;
  const auto inp = rounded(randn(N * C, 96)), w = rounded(randn(int64_t{OC} * C, 97)), b = randn(OC, 98);
  const auto dout = rounded(randn(N * OC, 99));
  auto run = [&] {
    auto made = make_gpu();
    REQUIRE(made.has_value());
    Backend& gpu = **made;
    gpu.set_compute_dtype(DType::kBF16);
    Dev<float> g_inp(gpu, inp), g_w(gpu, w), g_b(gpu, b), g_dout(gpu, dout), g_out(gpu, N * OC);
    Dev<float> g_dinp(gpu, N * C), g_dw(gpu, int64_t{OC} * C), g_db(gpu, OC);
    gpu.matmul_forward(g_out.p(), g_inp.p(), g_w.p(), g_b.p(), N, C, OC);
    gpu.matmul_backward(g_dinp.p(), g_dw.p(), g_db.p(), g_dout.p(), g_inp.p(), g_w.p(), N, C, OC);
    return std::vector<std::vector<float>>{g_out.read(), g_dinp.read(), g_dw.read(), g_db.read()};
  };
  auto read = [](const std::string& p) {
    std::string text;
    REQUIRE(read_file(p, &text).is_ok());
    return text;
  };
  auto write = [&](const std::string& text) {
    REQUIRE(write_file_atomically(path, {std::span<const char>(text.data(), text.size())}).is_ok());
  };
  auto made_by_name = [] {
#ifdef GPT_PARITY_EMULATED
    return make_cuda_emu_backend(0, 1);
#else
    return make_backend("cuda");
#endif
  };
  const auto timed = run();
  algos.set(nullptr);
  const std::string written = read(path);
  CHECK(written.rfind("gpt-train cuBLASLt algorithm cache 1\nfor ", 0) == 0);
  size_t lines = 0;
  for (size_t at = written.find("\ngemm "); at != std::string::npos; at = written.find("\ngemm ", at + 1)) ++lines;
  CHECK(lines == 3);
  CHECK(run() == timed);
  CHECK(read(path) == written);  // nothing timed, nothing added
  REQUIRE(made_by_name().has_value());
  // Read as well: the file with CR line ends and blank lines; an empty one (a cache with nothing in it yet).
  std::string crlf;
  for (const char c : written) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  write(crlf + " \r\n\n");
  CHECK(made_by_name().has_value());
  write("");
  CHECK(made_by_name().has_value());
  const std::string target = written.substr(0, written.find("\ngemm"));
  const std::string line = written.substr(target.size() + 1, written.find('\n', target.size() + 1) - target.size());
  const std::string key = line.substr(0, line.find(" algo ") + 6), hex = line.substr(key.size());
  for (const auto& [text, error] :
       {std::pair{std::string("not a cache\n"), path + ":1: not a gpt-train GEMM algorithm cache"},
        std::pair{std::string("gpt-train cuBLASLt algorithm cache 1\nfor another GPU\n"),
                  path + ":2: written for another GPU; this run is for "},
        std::pair{target + "\ngemm 1 2 3 algo 00\n", path + ":3: expected 'gemm' and 16 integers"},
        std::pair{target + "\n" + key + "x" + hex.substr(1), path + ":3: expected"},  // not hexadecimal
        std::pair{target + "\n" + key + hex.substr(0, hex.size() - 1) + " 7\n", path + ":3: expected"},  // trailing
        std::pair{target + "\n\n" + key + "\n", path + ":4: expected"}}) {  // no hex after algo
    CAPTURE(text);
    write(text);
    const auto refused = made_by_name();
    REQUIRE_FALSE(refused.has_value());
    CHECK_THAT(refused.status().message(), Catch::Matchers::Contains(error));
  }
  // A run that will time shapes writes the file first: where it cannot, it stops before its timings are lost.
  cache.set((dir.file("missing") + "/algos.txt").c_str());
  algos.set("4");
  const auto unwritable = made_by_name();
  REQUIRE_FALSE(unwritable.has_value());
  CHECK_THAT(unwritable.status().message(), Catch::Matchers::Contains("GPT_GEMM_ALGO_CACHE"));
}

// Parameters sit at any element offset of their unit's buffer: matrices and a bias only 4-byte aligned (fp32), or 2
// (bf16).
TEST_CASE("parity: matmul on 4-byte aligned operands and bias, and 2-byte aligned bf16 ones", "[cuda]") {
  Backend* gpu = cuda_or_skip("unaligned matmul");
  if (!gpu) return;
  const int64_t N = 37;
  const int C = 29, OC = 51;
  auto inp = randn(N * C + 1, 86), w = randn(int64_t{OC} * C + 1, 87), b = randn(OC + 1, 88);
  std::vector<float> out(N * OC + 1);
  cpu().matmul_forward(out.data() + 1, inp.data() + 1, w.data() + 1, b.data() + 1, N, C, OC);
  Dev<float> g_inp(*gpu, inp), g_w(*gpu, w), g_b(*gpu, b), g_out(*gpu, out.size());
  gpu->matmul_forward(g_out.p() + 1, g_inp.p() + 1, g_w.p() + 1, g_b.p() + 1, N, C, OC);
  expect_close("unaligned matmul out", out, g_out.read(), kReduction);
  // Under bf16 compute: bf16 operands one element (2 bytes) past alignment, the output and the input gradient too,
  // dweight 4 bytes past (cuBLASLt is told each pointer's alignment; the heuristic must still find an algorithm).
  // Bounds as in the bf16 matmul case above.
  gpu->set_compute_dtype(DType::kBF16);
  const auto inp16 = rounded(inp), w16 = rounded(w), dout16 = rounded(randn(N * OC + 1, 89));
  std::vector<float> out_lo(N * OC + 1), dinp(N * C + 1), dw(int64_t{OC} * C + 1, 0.0f);
  cpu().matmul_forward(out_lo.data() + 1, inp16.data() + 1, w16.data() + 1, rounded(b).data() + 1, N, C, OC);
  cpu().matmul_backward(dinp.data() + 1, dw.data() + 1, nullptr, dout16.data() + 1, inp16.data() + 1, w16.data() + 1, N,
                        C, OC);
  Dev<bf16> g_inp16(*gpu, to_bf16(inp16)), g_w16(*gpu, to_bf16(w16)), g_dout16(*gpu, to_bf16(dout16));
  Dev<bf16> g_lo(*gpu, out_lo.size()), g_dinp_lo(*gpu, dinp.size());
  Dev<float> g_dw(*gpu, std::vector<float>(dw.size(), 0.0f));
  gpu->matmul_forward(g_lo.p() + 1, g_inp16.p() + 1, g_w16.p() + 1, g_b.p() + 1, N, C, OC);
  gpu->matmul_backward(g_dinp_lo.p() + 1, g_dw.p() + 1, nullptr, g_dout16.p() + 1, g_inp16.p() + 1, g_w16.p() + 1, N, C,
                       OC);
  const std::vector<bf16> lo = g_lo.read(), dinp_lo = g_dinp_lo.read();
  const std::vector<float> b16 = rounded(b);
  const BiasedBf16 out_worst = bf16_biased_worst(
      std::vector<float>(out_lo.begin() + 1, out_lo.end()), std::vector<bf16>(lo.begin() + 1, lo.end()),
      std::vector<float>(b16.begin() + 1, b16.end()), OC, kReduction * max_abs(out_lo), /*unaligned=*/true);
  const double worst_out = out_worst.worst;
  const double worst_dinp =
      bf16_worst(std::vector<float>(dinp.begin() + 1, dinp.end()),
                 std::vector<bf16>(dinp_lo.begin() + 1, dinp_lo.end()), kReduction * max_abs(dinp));
  INFO("2-byte aligned bf16 GEMMs: out " << out_worst.detail << "; dinp " << worst_dinp << " of its bound");
  CHECK(worst_out <= 1.0);
  CHECK(worst_dinp <= 1.0);
  const std::vector<float> got_dw = g_dw.read();
  expect_close("2-byte aligned bf16 dweight", std::vector<float>(dw.begin() + 1, dw.end()),
               std::vector<float>(got_dw.begin() + 1, got_dw.end()), kReduction);
  gpu->set_compute_dtype(DType::kF32);
}

// run.gelu_fusion under bf16 compute: the fc GEMM's GELU in cuBLASLt's epilogue (forward), and its backward in the
// projection's input-gradient GEMM (full). Forward: pre (the GELU's input) is the bf16 GEMM output, within the fp32
// sum's bound e and a bf16 place of the CPU's; the fused GELU is taken of the fp32 sum before that rounding, so it is
// within 1.13 e (max |GELU'| < 1.13) and a place of the CPU's fp32 GELU of its fp32 sum, plus, per element, what an
// error of cuBLASLt's tanh moves it by: cuBLASLt may use the hardware's approximate tanh (tanh.approx.f32, within
// 2^-10.99 absolute), so with t's error taken as 2^-10, GELU = 0.5 x (1 + t) moves by 0.5 |x| 2^-10 and
// GELU' = 0.5 (1 + t) + 0.5 x (1 - t^2) u' (u' = s (1 + 3 a x^2)) by |0.5 - x t u'| 2^-10 (times |dinp|). A wrong or
// missing epilogue is off by O(1). Unfused, out is the GELU of the rounded pre: the two differ somewhere, which shows
// the epilogue ran. Backward: the fused input gradient is GELU'(pre) times the GEMM's fp32 sum, rounded once; the
// fp32 scratch the unfused path writes is left as it was (NaN), and dweight and dbias are the unfused ones bit for
// bit (the same GEMM and kernels); the fc bias's gradient is bias_backward's of the dpre written, bit for bit, either
// way. The next test shows the model taking both fused ops.
std::vector<double> tanh_allowance(const std::vector<float>& x, const std::vector<float>* dinp) {
  constexpr double kS = 0.7978845608028654, kA = 0.044715, kTanhErr = 1.0 / 1024;
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], t = std::tanh(kS * (v + kA * v * v * v));
    out[i] = dinp == nullptr ? 0.5 * std::abs(v) * kTanhErr
                             : std::abs(0.5 - v * t * kS * (1.0 + 3.0 * kA * v * v)) * kTanhErr * std::abs((*dinp)[i]);
  }
  return out;
}

TEST_CASE("parity: GELU fused into the bf16 GEMMs (run.gelu_fusion)", "[cuda]") {
  Backend* gpu = cuda_or_skip("GELU epilogues");
  if (!gpu) return;
  CHECK_FALSE(cpu().set_gelu_fusion(GeluFusion::kForward).is_ok());
  CHECK_FALSE(gpu->set_gelu_fusion(GeluFusion::kFull).is_ok());  // fp32 compute: no bf16 GEMM to fuse into
  gpu->set_compute_dtype(DType::kBF16);
  const int64_t N = 70;
  const int C = 48, OC = 192;  // OC: the GELU's width, a multiple of 8
  {
    const auto inp = rounded(randn(N * C, 150)), w = rounded(randn(int64_t{OC} * C, 151, 0.3f));
    const auto b = rounded(randn(OC, 152));
    std::vector<float> sum(N * OC), want(N * OC);
    cpu().matmul_forward(sum.data(), inp.data(), w.data(), b.data(), N, C, OC);
    cpu().gelu_forward(want.data(), sum.data(), N * OC);
    Dev<float> g_inp(*gpu, inp), g_w(*gpu, w), g_b(*gpu, b);
    Dev<bf16> pre_u(*gpu, N * OC), out_u(*gpu, N * OC), pre_f(*gpu, N * OC), out_f(*gpu, N * OC);
    REQUIRE(gpu->set_gelu_fusion(GeluFusion::kNone).is_ok());
    gpu->matmul_gelu_forward(pre_u.p(), out_u.p(), g_inp.p(), g_w.p(), g_b.p(), N, C, OC);
    REQUIRE(gpu->set_gelu_fusion(GeluFusion::kForward).is_ok());
    gpu->matmul_gelu_forward(pre_f.p(), out_f.p(), g_inp.p(), g_w.p(), g_b.p(), N, C, OC);
    const double e = kReduction * max_abs(sum);
    const double pre_worst = bf16_worst(sum, pre_f.read(), e);
    const double out_worst = bf16_worst(want, out_f.read(), 1.13 * e, tanh_allowance(sum, nullptr));
    INFO("fused forward: pre " << pre_worst << ", out " << out_worst << " of their bounds");
    CHECK(pre_worst <= 1.0);
    CHECK(out_worst <= 1.0);
    const std::vector<bf16> a = out_u.read(), f = out_f.read();
    CHECK(std::memcmp(a.data(), f.data(), a.size() * sizeof(bf16)) != 0);
  }
  {
    const int C2 = OC, OC2 = C;  // the projection: the GELU's output (N, C2) in, OC2 out
    const auto pre = rounded(randn(N * C2, 153, 2.0f)), act = rounded(randn(N * C2, 154));
    const auto w = rounded(randn(int64_t{OC2} * C2, 155, 0.3f)), dout = rounded(randn(N * OC2, 156));
    std::vector<float> d(N * C2), want(N * C2), dw(int64_t{OC2} * C2, 0.0f), db(OC2, 0.0f);
    cpu().matmul_backward(d.data(), dw.data(), db.data(), dout.data(), act.data(), w.data(), N, C2, OC2);
    cpu().gelu_backward(want.data(), pre.data(), d.data(), N * C2);
    const double e = kReduction * max_abs(d);
    Dev<bf16> g_pre(*gpu, to_bf16(pre));
    Dev<float> g_act(*gpu, act), g_w(*gpu, w), g_dout(*gpu, dout);
    std::vector<float> got_dw[2], got_db[2];
    const std::vector<float> dpb0 = randn(C2, 157);                         // the fc bias's gradient, accumulated into
    for (const GeluFusion f : {GeluFusion::kForward, GeluFusion::kFull}) {  // kForward: backward unfused
      const bool fused = f == GeluFusion::kFull;
      CAPTURE(fused);
      REQUIRE(gpu->set_gelu_fusion(f).is_ok());
      Dev<bf16> g_dpre(*gpu, N * C2);
      Dev<float> g_scratch(*gpu, std::vector<float>(N * C2, NAN)), g_dw(*gpu, dw.size()), g_db(*gpu, OC2);
      Dev<float> g_dpb(*gpu, dpb0);
      gpu->matmul_backward_gelu(g_dpre.p(), g_dpb.p(), g_scratch.p(), g_dw.p(), g_db.p(), g_dout.p(), g_act.p(),
                                g_w.p(), g_pre.p(), N, C2, OC2);
      const std::vector<float> scratch = g_scratch.read();
      CHECK(std::all_of(scratch.begin(), scratch.end(), [](float v) { return std::isnan(v); }) == fused);
      const std::vector<bf16> dpre = g_dpre.read();
      const double worst = bf16_worst(want, dpre, 1.13 * e, fused ? tanh_allowance(pre, &d) : std::vector<double>{});
      INFO("input gradient: " << worst << " of its bound");
      CHECK(worst <= 1.0);
      got_dw[fused] = g_dw.read();
      got_db[fused] = g_db.read();
      expect_close("dweight", dw, got_dw[fused], kReduction);
      expect_close("dbias", db, got_db[fused], kReduction);
      // The fc bias's gradient: bias_backward of the dpre written, bit for bit (unfused, the GELU backward sums it
      // as it stores dpre), and the CPU's column sums of those values within the reduction bound.
      Dev<float> g_dpb_sep(*gpu, dpb0);
      gpu->bias_backward(g_dpb_sep.p(), g_dpre.p(), N, C2);
      const std::vector<float> dpb = g_dpb.read();
      CHECK(dpb == g_dpb_sep.read());
      std::vector<float> cdpb = dpb0, dpre_f(dpre.size());
      for (size_t i = 0; i < dpre.size(); ++i) dpre_f[i] = bf16_to_f32(dpre[i]);
      cpu().bias_backward(cdpb.data(), dpre_f.data(), N, C2);
      expect_close("dpre_bias", cdpb, dpb, kReduction);
    }
    CHECK(got_dw[0] == got_dw[1]);
    CHECK(got_db[0] == got_db[1]);
  }
  REQUIRE(gpu->set_gelu_fusion(GeluFusion::kNone).is_ok());
  gpu->set_compute_dtype(DType::kF32);
}

// matmul_backward_gelu's fc bias gradient (dpre_bias), unfused, with dpre in place over dinp as the model runs it
// (T: fp32 under fp32 compute, bf16 under bf16), over 3 row chunks and a partial block of columns: dpre is the
// separate matmul_backward and gelu_backward's bit for bit, dpre_bias bias_backward's of the dpre written bit for bit
// (the CUDA backend sums it inside the GELU backward: a product fused into the sum by an FMA would show here), and
// the CPU's column sums of those values within the reduction bound.
template <typename T>
void check_gelu_bias(Backend* gpu, DType compute) {
  gpu->set_compute_dtype(compute);
  const int64_t N = 600;
  const int C = 300, OC = 40;  // C: the GELU's width (dpre's), OC: the projection's outputs
  Dev<float> g_pre(*gpu, randn(N * C, 160, 2.0f)), g_act(*gpu, randn(N * C, 161));
  Dev<float> g_w(*gpu, randn(int64_t{OC} * C, 162, 0.3f)), g_dout(*gpu, randn(N * OC, 163));
  const std::vector<float> dpb0 = randn(C, 164);
  Dev<T> g_d(*gpu, N * C);
  Dev<float> g_dw(*gpu, std::vector<float>(int64_t{OC} * C, 0.0f)), g_db(*gpu, std::vector<float>(OC, 0.0f));
  Dev<float> g_dpb(*gpu, dpb0);
  gpu->matmul_backward_gelu(g_d.p(), g_dpb.p(), g_d.p(), g_dw.p(), g_db.p(), g_dout.p(), g_act.p(), g_w.p(), g_pre.p(),
                            N, C, OC);
  Dev<T> g_dinp(*gpu, N * C), g_dpre(*gpu, N * C);
  Dev<float> g_dw2(*gpu, std::vector<float>(int64_t{OC} * C, 0.0f)), g_db2(*gpu, std::vector<float>(OC, 0.0f));
  Dev<float> g_dpb2(*gpu, dpb0);
  gpu->matmul_backward(g_dinp.p(), g_dw2.p(), g_db2.p(), g_dout.p(), g_act.p(), g_w.p(), N, C, OC);
  gpu->gelu_backward(g_dpre.p(), g_pre.p(), g_dinp.p(), N * C);
  gpu->bias_backward(g_dpb2.p(), g_dpre.p(), N, C);
  const std::vector<T> d = g_d.read(), dpre = g_dpre.read();
  CHECK(std::memcmp(d.data(), dpre.data(), d.size() * sizeof(T)) == 0);
  CHECK(g_dw.read() == g_dw2.read());
  CHECK(g_db.read() == g_db2.read());
  const std::vector<float> dpb = g_dpb.read();
  CHECK(dpb == g_dpb2.read());
  std::vector<float> wide(d.size()), cdpb = dpb0;
  for (size_t i = 0; i < d.size(); ++i) {
    if constexpr (std::is_same_v<T, bf16>) {
      wide[i] = bf16_to_f32(d[i]);
    } else {
      wide[i] = d[i];
    }
  }
  cpu().bias_backward(cdpb.data(), wide.data(), N, C);
  expect_close("dpre_bias", cdpb, dpb, kReduction);
  gpu->set_compute_dtype(DType::kF32);
}

TEST_CASE("parity: matmul_backward_gelu's fc bias gradient is bias_backward's of the dpre written", "[cuda]") {
  Backend* gpu = cuda_or_skip("the GELU backward with the fc bias");
  if (!gpu) return;
  {
    INFO("fp32 compute");
    check_gelu_bias<float>(gpu, DType::kF32);
  }
  {
    INFO("bf16 compute");
    check_gelu_bias<bf16>(gpu, DType::kBF16);
  }
}

// GPT_GEMM_DGELU_BGRAD=1 (an experiment): the fc bias's gradient from the DGELU GEMM's epilogue, the row sums of the
// fp32 values before their rounding to dpre. dpre_bias: dpb0 (100 + noise: an overwrite would show) plus the CPU's
// column sums of the dpre written, within the reduction bound plus each element's bf16 rounding (2^-8 of the
// magnitudes summed), with and without it (without: bias_backward's of the dpre written, bit for bit); dweight and
// dbias the same bits either way. In the emulator the epilogue's sums must differ from the kernel's (the path taken),
// and where its cuBLASLt has no such algorithm (a fresh backend: plans are cached) the kernel's, bit for bit; on a GPU
// whose cuBLASLt lacks it the log says so and the kernel sums it.
TEST_CASE("parity: the fc bias gradient from the DGELU GEMM's epilogue (GPT_GEMM_DGELU_BGRAD=1)", "[cuda]") {
  Backend* gpu = cuda_or_skip("the DGELU_BGRAD epilogue");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  REQUIRE(gpu->set_gelu_fusion(GeluFusion::kFull).is_ok());
  const int64_t N = 600;
  const int C = 192, OC = 48;  // C: the GELU's width (dpre's, a multiple of 8), OC: the projection's outputs
  const auto pre = rounded(randn(N * C, 170, 2.0f)), act = rounded(randn(N * C, 171));
  const auto w = rounded(randn(int64_t{OC} * C, 172, 0.3f)), dout = rounded(randn(N * OC, 173));
  std::vector<float> dpb0 = randn(C, 174);
  for (float& b : dpb0) b += 100.0f;
  Dev<bf16> g_pre(*gpu, to_bf16(pre));
  Dev<float> g_act(*gpu, act), g_w(*gpu, w), g_dout(*gpu, dout);
  std::vector<float> got_dw[3], got_db[3];
#ifdef GPT_PARITY_EMULATED
  auto made = make_gpu();  // its cuBLASLt without DGELU_BGRAD (below)
  REQUIRE(made.has_value());
  const std::unique_ptr<Backend> refusing = std::move(*made);
  refusing->set_compute_dtype(DType::kBF16);
  REQUIRE(refusing->set_gelu_fusion(GeluFusion::kFull).is_ok());
  const int runs = 3;
#else
  const int runs = 2;
#endif
  for (int run = 0; run < runs; ++run) {
    const bool epilogue = run > 0;  // run 2: asked for, but refused
    CAPTURE(run);
    const testing::ScopedEnv env("GPT_GEMM_DGELU_BGRAD", epilogue ? "1" : nullptr);
#ifdef GPT_PARITY_EMULATED
    emu_lt_no_dgelu_bgrad = run == 2;
    Backend* be = run == 2 ? refusing.get() : gpu;
#else
    Backend* be = gpu;
#endif
    Dev<bf16> g_dpre(*be, N * C);
    Dev<float> g_dinp(*be, std::vector<float>(N * C, NAN));
    Dev<float> g_dw(*be, std::vector<float>(int64_t{OC} * C, 0.0f)), g_db(*be, std::vector<float>(OC, 0.0f));
    Dev<float> g_dpb(*be, dpb0), g_dpb_sep(*be, dpb0);
    be->matmul_backward_gelu(g_dpre.p(), g_dpb.p(), g_dinp.p(), g_dw.p(), g_db.p(), g_dout.p(), g_act.p(), g_w.p(),
                             g_pre.p(), N, C, OC);
    be->bias_backward(g_dpb_sep.p(), g_dpre.p(), N, C);
    const std::vector<bf16> dpre = g_dpre.read();
    std::vector<float> dpre_f(dpre.size()), cdpb = dpb0;
    for (size_t i = 0; i < dpre.size(); ++i) dpre_f[i] = bf16_to_f32(dpre[i]);
    cpu().bias_backward(cdpb.data(), dpre_f.data(), N, C);
    const std::vector<float> dpb = g_dpb.read();
    double worst = 0;
    for (int c = 0; c < C; ++c) {
      double mag = std::abs(dpb0[c]);
      for (int64_t r = 0; r < N; ++r) mag += std::abs(dpre_f[r * C + c]);
      const double err = std::isfinite(dpb[c]) ? std::abs(dpb[c] - cdpb[c]) : INFINITY;
      worst = std::max(worst, err / (kReduction * mag + std::ldexp(mag, -8)));
    }
    INFO("dpre_bias: " << worst << " of its bound");
    CHECK(worst <= 1.0);
    if (run != 1) CHECK(dpb == g_dpb_sep.read());
    if (run == 1 && kEmulated) CHECK(dpb != g_dpb_sep.read());
    got_dw[run] = g_dw.read();
    got_db[run] = g_db.read();
  }
#ifdef GPT_PARITY_EMULATED
  emu_lt_no_dgelu_bgrad = false;
#endif
  for (int run = 1; run < runs; ++run) {
    CHECK(got_dw[run] == got_dw[0]);
    CHECK(got_db[run] == got_db[0]);
  }
  REQUIRE(gpu->set_gelu_fusion(GeluFusion::kNone).is_ok());
  gpu->set_compute_dtype(DType::kF32);
}

// LayerNorm forward and backward of the rows `inp` (N x C) on the CPU and on `gpu`: within kReduction, the
// recomputation (null statistics) and the bf16 outputs bit for bit.
void compare_layernorm(Backend* gpu, const std::vector<float>& inp, int64_t N, int C) {
  auto w = randn(C, 21), b = randn(C, 22), dout = randn(N * C, 23);
  auto dinp = randn(N * C, 24), dw = randn(C, 25), db = randn(C, 26);  // accumulated into
  std::vector<float> out(N * C), mean(N), rstd(N), c_dinp = dinp, c_dw = dw, c_db = db;
  cpu().layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  cpu().layernorm_backward(c_dinp.data(), c_dw.data(), c_db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                           rstd.data(), N, C, nullptr);
  Dev<float> g_inp(*gpu, inp), g_w(*gpu, w), g_b(*gpu, b), g_dout(*gpu, dout);
  Dev<float> g_out(*gpu, out.size()), g_mean(*gpu, N), g_rstd(*gpu, N);
  Dev<float> g_dinp(*gpu, dinp), g_dw(*gpu, dw), g_db(*gpu, db);
  gpu->layernorm_forward(g_out.p(), g_mean.p(), g_rstd.p(), g_inp.p(), g_w.p(), g_b.p(), N, C);
  Dev<bf16> g_dlo(*gpu, dinp.size());
  gpu->layernorm_backward(g_dinp.p(), g_dw.p(), g_db.p(), g_dout.p(), g_inp.p(), g_w.p(), g_mean.p(), g_rstd.p(), N, C,
                          g_dlo.p());
  {  // the bf16 copy of the accumulated dinp: its rounding, bit for bit
    std::vector<bf16> want(dinp.size());
    cpu().cast_to_bf16(want.data(), g_dinp.read().data(), static_cast<int64_t>(want.size()));
    const std::vector<bf16> got = g_dlo.read();
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(bf16)) == 0);
  }
  expect_close("layernorm out", out, g_out.read(), kReduction);
  expect_close("layernorm mean", mean, g_mean.read(), kReduction);
  expect_close("layernorm rstd", rstd, g_rstd.read(), kReduction);
  expect_close("layernorm dinp", c_dinp, g_dinp.read(), kReduction);
  expect_close("layernorm dweight", c_dw, g_dw.read(), kReduction);
  expect_close("layernorm dbias", c_db, g_db.read(), kReduction);
  {  // A bf16 dout (a GEMM's input gradient under bf16 compute) reads as its widening: dinp, dweight and dbias those
     // of the fp32 dout of its values, bit for bit, on both backends.
    std::vector<bf16> dh(N * C);
    cpu().cast_to_bf16(dh.data(), dout.data(), N * C);
    std::vector<float> dwide(N * C);
    cpu().cast_from_bf16(dwide.data(), dh.data(), N * C);
    Dev<bf16> g_dh(*gpu, dh);
    Dev<float> g_dwide(*gpu, dwide);
    Dev<float> a_dinp(*gpu, dinp), a_dw(*gpu, dw), a_db(*gpu, db), b_dinp(*gpu, dinp), b_dw(*gpu, dw), b_db(*gpu, db);
    gpu->layernorm_backward(a_dinp.p(), a_dw.p(), a_db.p(), g_dh.p(), g_inp.p(), g_w.p(), g_mean.p(), g_rstd.p(), N, C,
                            nullptr);
    gpu->layernorm_backward(b_dinp.p(), b_dw.p(), b_db.p(), g_dwide.p(), g_inp.p(), g_w.p(), g_mean.p(), g_rstd.p(), N,
                            C, nullptr);
    CHECK(a_dinp.read() == b_dinp.read());
    CHECK(a_dw.read() == b_dw.read());
    CHECK(a_db.read() == b_db.read());
    std::vector<float> ca = dinp, caw = dw, cab = db, cb = dinp, cbw = dw, cbb = db;
    cpu().layernorm_backward(ca.data(), caw.data(), cab.data(), dh.data(), inp.data(), w.data(), mean.data(),
                             rstd.data(), N, C, nullptr);
    cpu().layernorm_backward(cb.data(), cbw.data(), cbb.data(), dwide.data(), inp.data(), w.data(), mean.data(),
                             rstd.data(), N, C, nullptr);
    CHECK(ca == cb);
    CHECK(caw == cbw);
    CHECK(cab == cbb);
  }
  // Recomputation passes null statistics.
  Dev<float> g_out2(*gpu, out.size());
  gpu->layernorm_forward(g_out2.p(), nullptr, nullptr, g_inp.p(), g_w.p(), g_b.p(), N, C);
  REQUIRE(g_out2.read() == g_out.read());
  // A bf16 output (a GEMM input under bf16 compute) is the fp32 one rounded, bit for bit.
  Dev<bf16> g_lo(*gpu, out.size());
  gpu->layernorm_forward(g_lo.p(), nullptr, nullptr, g_inp.p(), g_w.p(), g_b.p(), N, C);
  std::vector<bf16> want(out.size());
  cpu().cast_to_bf16(want.data(), g_out.read().data(), static_cast<int64_t>(want.size()));
  const std::vector<bf16> got = g_lo.read();
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(bf16)) == 0);
}

TEST_CASE("parity: layernorm forward and backward", "[cuda]") {
  Backend* gpu = cuda_or_skip("layernorm");
  if (!gpu) return;
  for (const auto& [N, C] : {std::pair<int64_t, int>{1, 7}, {37, 48}, {600, 768}, {65, 1600}}) {
    CAPTURE(N, C);
    compare_layernorm(gpu, randn(N * C, 20, 3.0f), N, C);
  }
}

// Rows a kernel's statistics can get wrong: constant (variance 0: the output is the bias exactly), a large mean
// with a small spread (a one-pass variance loses it; integers, so every sum is exact on both sides), and the widest
// rows the backward takes (C 12288: one or two warps a block).
TEST_CASE("parity: layernorm of constant rows, a large mean, and the widest rows", "[cuda]") {
  Backend* gpu = cuda_or_skip("layernorm edges");
  if (!gpu) return;
  const int C = 768;
  std::vector<float> inp = randn(6 * C, 27, 3.0f);  // rows 4 and 5 stay random
  for (int c = 0; c < C; ++c) {
    inp[c] = 2.5f;
    inp[C + c] = -7.0f;
    inp[2 * C + c] = 1000.0f + static_cast<float>(c % 9 - 4);
    inp[3 * C + c] = -3000.0f + static_cast<float>((c * 7) % 9 - 4);
  }
  compare_layernorm(gpu, inp, 6, C);
  const auto w = randn(C, 21), b = randn(C, 22);
  Dev<float> g_inp(*gpu, inp), g_w(*gpu, w), g_b(*gpu, b), g_out(*gpu, inp.size()), g_mean(*gpu, 6), g_rstd(*gpu, 6);
  gpu->layernorm_forward(g_out.p(), g_mean.p(), g_rstd.p(), g_inp.p(), g_w.p(), g_b.p(), 6, C);
  const std::vector<float> out = g_out.read();
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(std::equal(b.begin(), b.end(), out.begin() + r * C));  // (x - mean) = 0 exactly
  }
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }));
  CAPTURE(12288);
  compare_layernorm(gpu, randn(3 * 12288, 28, 3.0f), 3, 12288);
}

TEST_CASE("parity: fused residual + layernorm, and bit for bit the two separate ops", "[cuda]") {
  Backend* gpu = cuda_or_skip("residual_layernorm");
  if (!gpu) return;
  for (const auto& [N, C, p] :
       {std::tuple<int64_t, int, float>{1, 7, 0.0f}, {37, 48, 0.2f}, {600, 768, 0.0f}, {65, 1600, 0.1f}}) {
    CAPTURE(N, C, p);
    const DropoutMask drop = p > 0.0f ? mask(p, 5) : DropoutMask{};
    auto res = randn(N * C, 30, 2.0f), add = randn(N * C, 31), w = randn(C, 32), b = randn(C, 33);
    std::vector<float> c_res(N * C), out(N * C), mean(N), rstd(N);
    cpu().residual_layernorm_forward(c_res.data(), out.data(), mean.data(), rstd.data(), res.data(), add.data(),
                                     w.data(), b.data(), N, C, drop);
    Dev<float> g_res(*gpu, res), g_add(*gpu, add), g_w(*gpu, w), g_b(*gpu, b);
    Dev<float> g_out(*gpu, out.size()), g_mean(*gpu, N), g_rstd(*gpu, N);
    Dev<float> s_res(*gpu, res.size()), s_out(*gpu, out.size()), s_mean(*gpu, N), s_rstd(*gpu, N);
    gpu->residual_forward(s_res.p(), g_res.p(), g_add.p(), N * C, drop);
    gpu->layernorm_forward(s_out.p(), s_mean.p(), s_rstd.p(), s_res.p(), g_w.p(), g_b.p(), N, C);
    // In place, as the model calls it for res_mid: res_out aliases res.
    gpu->residual_layernorm_forward(g_res.p(), g_out.p(), g_mean.p(), g_rstd.p(), g_res.p(), g_add.p(), g_w.p(),
                                    g_b.p(), N, C, drop);
    expect_close("residual", c_res, g_res.read(), kElementwise);
    expect_close("layernorm out", out, g_out.read(), kReduction);
    expect_close("layernorm mean", mean, g_mean.read(), kReduction);
    expect_close("layernorm rstd", rstd, g_rstd.read(), kReduction);
    REQUIRE(g_res.read() == s_res.read());
    REQUIRE(g_out.read() == s_out.read());
    REQUIRE(g_mean.read() == s_mean.read());
    REQUIRE(g_rstd.read() == s_rstd.read());
    // A bf16 added term (a projection's output under bf16 compute) reads as its widening: fused and separate, on
    // both backends, bit for bit what the fp32 term of its values gives.
    std::vector<bf16> ah(N * C);
    cpu().cast_to_bf16(ah.data(), add.data(), N * C);
    std::vector<float> aw(N * C);
    cpu().cast_from_bf16(aw.data(), ah.data(), N * C);
    Dev<bf16> g_ah(*gpu, ah);
    Dev<float> g_aw(*gpu, aw), h_res(*gpu, res), h_out(*gpu, out.size()), w_res(*gpu, res), w_out(*gpu, out.size());
    gpu->residual_layernorm_forward(h_res.p(), h_out.p(), nullptr, nullptr, h_res.p(), g_ah.p(), g_w.p(), g_b.p(), N, C,
                                    drop);
    gpu->residual_layernorm_forward(w_res.p(), w_out.p(), nullptr, nullptr, w_res.p(), g_aw.p(), g_w.p(), g_b.p(), N, C,
                                    drop);
    CHECK(h_res.read() == w_res.read());
    CHECK(h_out.read() == w_out.read());
    Dev<float> r_h(*gpu, res.size()), r_w(*gpu, res.size());
    gpu->residual_forward(r_h.p(), g_res.p(), g_ah.p(), N * C, drop);
    gpu->residual_forward(r_w.p(), g_res.p(), g_aw.p(), N * C, drop);
    CHECK(r_h.read() == r_w.read());
    std::vector<float> ch_res(N * C), ch_out(N * C), cw_res(N * C), cw_out(N * C), cr_h(N * C), cr_w(N * C);
    cpu().residual_layernorm_forward(ch_res.data(), ch_out.data(), nullptr, nullptr, res.data(), ah.data(), w.data(),
                                     b.data(), N, C, drop);
    cpu().residual_layernorm_forward(cw_res.data(), cw_out.data(), nullptr, nullptr, res.data(), aw.data(), w.data(),
                                     b.data(), N, C, drop);
    CHECK(ch_res == cw_res);
    CHECK(ch_out == cw_out);
    cpu().residual_forward(cr_h.data(), res.data(), ah.data(), N * C, drop);
    cpu().residual_forward(cr_w.data(), res.data(), aw.data(), N * C, drop);
    CHECK(cr_h == cr_w);
  }
}

struct AttentionShape {
  int B, T, C, NH;
};

// Attention forward and backward on the CPU and on `gpu` from the same random qkv and dout (streams seed and
// seed + 1): out and dqkv within `tol`, and a second backward on the GPU bit for bit the first.
void compare_attention(Backend& gpu, const AttentionShape& s, const DropoutMask& drop, uint64_t seed, double tol,
                       const std::string& what, float qkv_scale = 1.0f) {
  const int64_t N = int64_t{s.B} * s.T;
  auto qkv = randn(N * 3 * s.C, seed, qkv_scale), dout = randn(N * s.C, seed + 1);
  std::vector<float> out(N * s.C), dqkv(N * 3 * s.C);
  std::vector<float> att(cpu().attention_state_floats(s.B, s.T, s.NH));
  cpu().attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH, drop);
  cpu().attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH, drop,
                           nullptr);
  Dev<float> g_qkv(gpu, qkv), g_dout(gpu, dout), g_out(gpu, out.size());
  Dev<float> g_att(gpu, gpu.attention_state_floats(s.B, s.T, s.NH)), g_dqkv(gpu, dqkv.size());
  gpu.attention_forward(g_out.p(), g_att.p(), g_qkv.p(), s.B, s.T, s.C, s.NH, drop);
  gpu.attention_backward(g_dqkv.p(), g_dout.p(), g_qkv.p(), g_out.p(), g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
  expect_close(what + " out", out, g_out.read(), tol);
  const auto first = g_dqkv.read();
  expect_close(what + " dqkv", dqkv, first, tol);
  gpu.attention_backward(g_dqkv.p(), g_dout.p(), g_qkv.p(), g_out.p(), g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
  REQUIRE(g_dqkv.read() == first);  // deterministic
}

// The same with qkv, the output and dqkv in bf16 (the model's storage under bf16 compute; under
// run.attention_kernel auto the mma.sync kernels): the CPU runs on the bf16 qkv widened, the GPU's bf16 outputs
// are compared widened.
void compare_attention_bf16(Backend& gpu, const AttentionShape& s, const DropoutMask& drop, uint64_t seed, double tol,
                            const std::string& what, float qkv_scale = 1.0f) {
  const int64_t N = int64_t{s.B} * s.T, nq = N * 3 * s.C, no = N * s.C;
  std::vector<bf16> qh(nq);
  cpu().cast_to_bf16(qh.data(), randn(nq, seed, qkv_scale).data(), nq);
  std::vector<float> qkv(nq);
  cpu().cast_from_bf16(qkv.data(), qh.data(), nq);
  const auto dout = randn(no, seed + 1);
  std::vector<float> out(no), dqkv(nq);
  std::vector<float> att(cpu().attention_state_floats(s.B, s.T, s.NH));
  cpu().attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH, drop);
  cpu().attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH, drop,
                           nullptr);
  Dev<bf16> g_qkv(gpu, qh), g_out(gpu, no), g_dqkv(gpu, nq);
  Dev<float> g_dout(gpu, dout), g_att(gpu, gpu.attention_state_floats(s.B, s.T, s.NH));
  gpu.attention_forward(g_out.p(), g_att.p(), g_qkv.p(), s.B, s.T, s.C, s.NH, drop);
  gpu.attention_backward(g_dqkv.p(), g_dout.p(), g_qkv.p(), g_out.p(), g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
  auto widened = [](const std::vector<bf16>& x) {
    std::vector<float> w(x.size());
    cpu().cast_from_bf16(w.data(), x.data(), static_cast<int64_t>(x.size()));
    return w;
  };
  expect_close(what + " out", out, widened(g_out.read()), tol);
  const auto first = g_dqkv.read();
  expect_close(what + " dqkv", dqkv, widened(first), tol);
  gpu.attention_backward(g_dqkv.p(), g_dout.p(), g_qkv.p(), g_out.p(), g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
  const auto again = g_dqkv.read();
  REQUIRE(std::memcmp(again.data(), first.data(), first.size() * sizeof(bf16)) == 0);  // deterministic
}

// Parameters held in bf16 (ShardedParams under bf16 compute) are read widened on the GPU: LayerNorm (plain, fused,
// backward), the embedding and a GEMM's bias (bf16 output: the epilogue's own vector, aligned or copied; fp32 output:
// widened) give what their fp32 values give, bit for bit.
TEST_CASE("parity: bf16 parameters on CUDA give the results of their fp32 values bit for bit", "[cuda]") {
  Backend* gpu = cuda_or_skip("bf16 parameters");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  const int N = 37, C = 64, V = 29, OC = 3 * C;
  auto lo_of = [](const std::vector<float>& x, size_t at) {  // x in bf16 at element `at` of a bigger buffer
    std::vector<bf16> r(x.size() + at + 8);
    for (size_t i = 0; i < x.size(); ++i) r[at + i] = f32_to_bf16(x[i]);
    return r;
  };
  const auto x = randn(N * C, 61), add = randn(N * C, 62), dout = randn(N * C, 63), inp = randn(N * C, 64);
  const auto w = rounded(randn(C, 65)), b = rounded(randn(C, 66)), gw = rounded(randn(OC * C, 67));
  const auto gb = rounded(randn(OC, 68)), wte = rounded(randn(V * C, 69)), wpe = rounded(randn(N * C, 70));
  const auto tokens = rand_tokens(N, V, 71);
  Dev<float> dx(*gpu, x), dadd(*gpu, add), ddout(*gpu, dout), dinp(*gpu, inp), dw(*gpu, w), db(*gpu, b), dgw(*gpu, gw),
      dgb(*gpu, gb), dwte(*gpu, wte), dwpe(*gpu, wpe);
  Dev<int32_t> dtok(*gpu, tokens);
  for (const size_t at : {size_t{0}, size_t{1}}) {  // aligned, and 2 bytes past it (the scalar paths, a copied bias)
    CAPTURE(at);
    Dev<bf16> lw(*gpu, lo_of(w, at)), lb(*gpu, lo_of(b, at)), lgb(*gpu, lo_of(gb, at)), lwte(*gpu, lo_of(wte, at)),
        lwpe(*gpu, lo_of(wpe, at));
    const ConstTensorPtr pw[2] = {dw.p(), lw.p() + at}, pb[2] = {db.p(), lb.p() + at}, pgb[2] = {dgb.p(), lgb.p() + at};
    std::vector<float> y[2], res[2], dxs[2], dws[2], dbs[2], g[2], e[2];
    std::vector<bf16> y_lo[2], g_lo[2];
    for (int k = 0; k < 2; ++k) {
      Dev<float> out(*gpu, N * C), mean(*gpu, N), rstd(*gpu, N), r(*gpu, N * C), dxk(*gpu, add), dwk(*gpu, w),
          dbk(*gpu, b), gout(*gpu, N * OC), eout(*gpu, N * C);
      Dev<bf16> out_lo(*gpu, N * C), gout_lo(*gpu, N * OC);
      gpu->layernorm_forward(out.p(), mean.p(), rstd.p(), dx.p(), pw[k], pb[k], N, C);
      gpu->residual_layernorm_forward(r.p(), out_lo.p(), nullptr, nullptr, dx.p(), dadd.p(), pw[k], pb[k], N, C,
                                      mask(0.2f));
      gpu->layernorm_backward(dxk.p(), dwk.p(), dbk.p(), ddout.p(), dx.p(), pw[k], mean.p(), rstd.p(), N, C, nullptr);
      gpu->matmul_forward(gout.p(), dinp.p(), dgw.p(), pgb[k], N, C, OC);
      gpu->matmul_forward(gout_lo.p(), dinp.p(), dgw.p(), pgb[k], N, C, OC);
      if (k == 0) {
        gpu->embedding_forward(eout.p(), dtok.p(), dwte.p(), dwpe.p(), 1, N, C);
      } else {
        gpu->embedding_forward(eout.p(), dtok.p(), lwte.p() + at, lwpe.p() + at, 1, N, C);
      }
      y[k] = out.read(), res[k] = r.read(), y_lo[k] = out_lo.read(), dxs[k] = dxk.read(), dws[k] = dwk.read();
      dbs[k] = dbk.read(), g[k] = gout.read(), g_lo[k] = gout_lo.read(), e[k] = eout.read();
    }
    auto same = [](const auto& a, const auto& c) {
      return a.size() == c.size() && std::memcmp(a.data(), c.data(), a.size() * sizeof(a[0])) == 0;
    };
    CHECK(same(y[1], y[0]));
    CHECK(same(res[1], res[0]));
    CHECK(same(y_lo[1], y_lo[0]));
    CHECK(same(dxs[1], dxs[0]));
    CHECK(same(dws[1], dws[0]));
    CHECK(same(dbs[1], dbs[0]));
    CHECK(same(g[1], g[0]));
    CHECK(same(g_lo[1], g_lo[0]));
    CHECK(same(e[1], e[0]));
  }
  gpu->set_compute_dtype(DType::kF32);
}

TEST_CASE("parity: fused attention forward and backward, with and without dropout", "[cuda]") {
  Backend* gpu = cuda_or_skip("attention");
  if (!gpu) return;
  using Shape = AttentionShape;
  // Head sizes 8, 8, 64, 64, 128 with T off the tile sizes; then T a multiple of the tiles (64, 128: no partial
  // tile at all), at head sizes 64 and 128; on a GPU also GPT-2 124M's shape (T 1024, 12 heads of 64).
  std::vector<Shape> shapes = {Shape{1, 1, 8, 1},     Shape{2, 13, 32, 4},   Shape{2, 70, 128, 2},
                               Shape{1, 129, 256, 4}, Shape{1, 200, 256, 2}, Shape{1, 64, 128, 2},
                               Shape{2, 128, 128, 2}, Shape{1, 128, 256, 2}};
  if (gpu_sized_shapes()) shapes.push_back(Shape{1, 1024, 768, 12});
  for (const Shape s : shapes) {
    for (float p : {0.0f, 0.25f}) {
      CAPTURE(s.B, s.T, s.C, s.NH, p);
      REQUIRE(gpu->attention_state_floats(s.B, s.T, s.NH) == int64_t{s.B} * s.NH * s.T);  // no T x T state
      compare_attention(*gpu, s, mask(p, 1000), 30, kReduction, "attention");
    }
  }
}

// bf16 compute: q, k, v, dO, P and dS are rounded to bf16 (2^-9 relative) for the tensor cores, sums stay
// fp32; over up to a few hundred terms that leaves errors of ~5e-3 of the largest element (measured in an
// emulator: at most 4.8e-3), so 2e-2 catches real mistakes (O(1)) without failing on rounding.
TEST_CASE("parity: tensor-core attention (bf16 compute) against the CPU's fp32", "[cuda]") {
  Backend* gpu = cuda_or_skip("tensor-core attention");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  using Shape = AttentionShape;
  // Head sizes 32, 32, 64, 128, 64 with T off the tile sizes; then T a multiple of the 64-row tiles at head sizes
  // 64 and 128; on a GPU also GPT-2 124M's shape (T 1024, 12 heads of 64).
  std::vector<Shape> shapes = {Shape{1, 1, 64, 2},    Shape{3, 17, 96, 3},   Shape{2, 65, 128, 2},
                               Shape{1, 130, 256, 2}, Shape{2, 100, 256, 4}, Shape{1, 64, 128, 2},
                               Shape{2, 128, 128, 2}, Shape{1, 128, 256, 2}};
  if (gpu_sized_shapes()) shapes.push_back(Shape{1, 1024, 768, 12});
  for (const Shape s : shapes) {
    for (float p : {0.0f, 0.2f}) {
      CAPTURE(s.B, s.T, s.C, s.NH, p);
      compare_attention(*gpu, s, mask(p, 987654321), 32, 2e-2, "tc attention");
      // bf16 tensors: the mma.sync kernels; the bf16 output's own rounding (2^-9) fits the same tolerance.
      compare_attention_bf16(*gpu, s, mask(p, 987654321), 32, 2e-2, "mma attention");
    }
  }
  // qkv, the output and dqkv in bf16 (the model's storage under bf16 compute), on the WMMA kernel and the fp32 one
  // (head size 16): bit for bit the fp32 tensors of the same values (qkv widened, the output and dqkv rounded).
  REQUIRE(gpu->set_attention_kernel(AttentionKernel::kWmma).is_ok());
  for (const Shape s : {Shape{2, 65, 128, 2}, Shape{2, 33, 64, 4}}) {
    CAPTURE(s.B, s.T, s.C, s.NH);
    const int64_t nq = int64_t{s.B} * s.T * 3 * s.C, no = int64_t{s.B} * s.T * s.C;
    const DropoutMask drop = mask(0.1f, 4242);
    std::vector<bf16> qh(nq);
    cpu().cast_to_bf16(qh.data(), randn(nq, 90).data(), nq);
    std::vector<float> qw(nq);
    cpu().cast_from_bf16(qw.data(), qh.data(), nq);
    const auto dout = randn(no, 91);
    const int64_t na = gpu->attention_state_floats(s.B, s.T, s.NH);
    Dev<bf16> g_qh(*gpu, qh), g_oh(*gpu, no), g_dh(*gpu, nq);  // dqkv in qkv's dtype
    Dev<float> g_qw(*gpu, qw), g_ow(*gpu, no), g_dout(*gpu, dout),
        g_att[2] = {Dev<float>(*gpu, na), Dev<float>(*gpu, na)}, g_dw(*gpu, nq);
    gpu->attention_forward(g_oh.p(), g_att[0].p(), g_qh.p(), s.B, s.T, s.C, s.NH, drop);
    gpu->attention_forward(g_ow.p(), g_att[1].p(), g_qw.p(), s.B, s.T, s.C, s.NH, drop);
    std::vector<bf16> want(no);
    cpu().cast_to_bf16(want.data(), g_ow.read().data(), no);
    const std::vector<bf16> got = g_oh.read();
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(bf16)) == 0);
    CHECK(g_att[0].read() == g_att[1].read());
    // The backward reads the output too: the fp32 run gets the bf16 one's values (the fp32 kernel's D sums the
    // output as stored; the tensor-core kernel's rounds it to bf16 either way).
    std::vector<float> ow2(no);
    cpu().cast_from_bf16(ow2.data(), got.data(), no);
    Dev<float> g_ow2(*gpu, ow2);
    gpu->attention_backward(g_dh.p(), g_dout.p(), g_qh.p(), g_oh.p(), g_att[0].p(), s.B, s.T, s.C, s.NH, drop, nullptr);
    gpu->attention_backward(g_dw.p(), g_dout.p(), g_qw.p(), g_ow2.p(), g_att[1].p(), s.B, s.T, s.C, s.NH, drop,
                            nullptr);
    std::vector<bf16> dwant(nq);
    cpu().cast_to_bf16(dwant.data(), g_dw.read().data(), nq);
    const std::vector<bf16> dgot = g_dh.read();
    CHECK(std::memcmp(dgot.data(), dwant.data(), dwant.size() * sizeof(bf16)) == 0);
  }
  REQUIRE(gpu->set_attention_kernel(AttentionKernel::kAuto).is_ok());
  gpu->set_compute_dtype(DType::kF32);
}

// The mma.sync kernels' configurations at head sizes 32 and 64 without dropout that the defaults there replaced:
// GPT_ATTENTION_FWD_ROWS=32 (the forward with 32 query rows per warp, 2 blocks per SM) with GPT_ATTENTION_BWD_BLOCKS=2
// (the backward's 2-block kernels, K and V kept in registers); and GPT_ATTENTION_DQ=recompute (the lean backward's dQ
// kernel recomputing S, P and dP instead of reading the dS^T its dK/dV kernel kept). Against the CPU's fp32 as the
// default kernels are, T off and on the tiles; and with dropout, where the variables change nothing (the dropout
// kernels run either way).
TEST_CASE("parity: tensor-core attention's other configurations (2 blocks, dQ recomputed, mma.sync, wgmma's)",
          "[cuda]") {
  Backend* gpu = cuda_or_skip("attention's other configurations");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  using Shape = AttentionShape;
  std::vector<Shape> shapes = {Shape{1, 1, 64, 2}, Shape{2, 65, 128, 2}, Shape{1, 130, 64, 2}, Shape{2, 128, 128, 2},
                               Shape{1, 97, 128, 2}};
  if (gpu_sized_shapes()) shapes.push_back(Shape{1, 1024, 768, 12});
  // 0: the 2-block kernels; 1: the dQ kernel recomputing dS; 2: the mma.sync kernels where sm_90 (and the
  // emulator) takes the wgmma ones at head size 64 (the 2-block configuration turns them off too); 3: the wgmma
  // forward with the mma.sync backward; 4: the wgmma dK/dV kernel at 64 queries per step; 5: at 32 with its
  // element-wise work overlapping the products (GPT_ATTENTION_WGMMA_OVERLAP); 6: the wgmma forward on key tiles of
  // 128 (GPT_ATTENTION_WGMMA_BK), 7: that with blocks of two warpgroups (GPT_ATTENTION_WGMMA_WG2, every kernel).
  for (const int config : {0, 1, 2, 3, 4, 5, 6, 7}) {
    CAPTURE(config);
    if (config == 0) {
      ::setenv("GPT_ATTENTION_FWD_ROWS", "32", 1);
      ::setenv("GPT_ATTENTION_BWD_BLOCKS", "2", 1);
    } else if (config == 1) {
      ::setenv("GPT_ATTENTION_DQ", "recompute", 1);
    }
    if (config == 0 || config == 2) ::setenv("GPT_ATTENTION_WGMMA", "0", 1);
    if (config == 3) ::setenv("GPT_ATTENTION_WGMMA", "fwd", 1);
    if (config == 4) ::setenv("GPT_ATTENTION_WGMMA_BQ", "64", 1);
    if (config == 5) ::setenv("GPT_ATTENTION_WGMMA_OVERLAP", "1", 1);
    if (config >= 6) ::setenv("GPT_ATTENTION_WGMMA_BK", "128", 1);
    if (config == 7) ::setenv("GPT_ATTENTION_WGMMA_WG2", "1", 1);
    for (const Shape s : shapes) {
      for (float p : {0.0f, 0.2f}) {
        CAPTURE(s.B, s.T, s.C, s.NH, p);
        compare_attention_bf16(*gpu, s, mask(p, 24680), 33, 2e-2, "mma attention, other configurations");
      }
    }
    ::unsetenv("GPT_ATTENTION_FWD_ROWS");
    ::unsetenv("GPT_ATTENTION_BWD_BLOCKS");
    ::unsetenv("GPT_ATTENTION_DQ");
    ::unsetenv("GPT_ATTENTION_WGMMA");
    ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
    ::unsetenv("GPT_ATTENTION_WGMMA_OVERLAP");
    ::unsetenv("GPT_ATTENTION_WGMMA_BK");
    ::unsetenv("GPT_ATTENTION_WGMMA_WG2");
  }
  gpu->set_compute_dtype(DType::kF32);
}

// The wgmma kernels' variants give the default kernels' out, lse and dqkv bit for bit, at 32 and 64 queries per dK/dV
// step, over 1 to 4 key tiles and a ragged T: the overlapped ones (GPT_ATTENTION_WGMMA_OVERLAP=1: the same products
// and sums, scheduled to overlap), the blocks of two warpgroups (GPT_ATTENTION_WGMMA_WG2=1: the same rows' work, two
// warpgroups sharing tiles; with T 64 and 192 a block's second warpgroup has no rows), both, the forward compiled
// for 4 blocks per SM instead of 5 (GPT_ATTENTION_WGMMA_FWD_BLOCKS=4: other registers, the same code), and the tiles
// every product of a block multiplies held in registers (GPT_ATTENTION_WGMMA_RS=1: the same products with their A
// from registers instead of shared memory), and the dK/dV kernel storing dS^T straight from its fragments instead of
// through shared memory (GPT_ATTENTION_WGMMA_DS_STAGE=0); and, in a case of its own (tagged [ws], which
// scripts/gpu/check.sh runs apart: a hang there leaves the other cases' results whole), warp-specialised
// (GPT_ATTENTION_WGMMA_WS_KV=2: a producer warp and two consumer warpgroups; with K and V in registers too; and with
// OVERLAP=1, its overlapped form, over WG2 and DS_STAGE=0, which it takes precedence over; =3: three consumer
// warpgroups, alone and overlapped; and GPT_ATTENTION_WGMMA_BQ=128, 128 queries per step at two consumers (alone and
// overlapped), against
// both 32's and 64's results: at T 64 and 192 a tile's last queries lie past dS^T's rows). Where the wgmma
// kernels do not run (not sm_90, not the emulator) every side is the mma.sync kernels'. The qkv bias gradient they
// sum as they store dqkv (added to 10 + noise): the CPU's column sums of the dqkv written within the reduction bound
// (once: not twice), the same bits in every variant, and under GPT_ATTENTION_WGMMA_BIAS=0 bias_backward's bit for bit.
// Each variant: GPT_ATTENTION_WGMMA_ OVERLAP, WG2, FWD_BLOCKS, RS, DS_STAGE, WS_KV, and BQ where not null (else the
// 32 or 64 of the results it is held to).
struct WgmmaVariant {
  const char *overlap, *wg2, *blocks, *rs, *stage, *ws_kv, *bq = nullptr;
};
void check_wgmma_variants(const char* what, const std::vector<WgmmaVariant>& variants) {
  Backend* gpu = cuda_or_skip(what);
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  const DropoutMask none = mask(0.0f, 1);
  for (const AttentionShape s :
       {AttentionShape{1, 64, 128, 2}, AttentionShape{1, 128, 128, 2}, AttentionShape{1, 192, 128, 2},
        AttentionShape{2, 256, 128, 2}, AttentionShape{1, 217, 128, 2}}) {
    for (const char* bq : {"32", "64"}) {
      CAPTURE(s.B, s.T, bq);
      const int64_t N = int64_t{s.B} * s.T, nq = N * 3 * s.C, no = N * s.C;
      std::vector<bf16> qh(nq);
      cpu().cast_to_bf16(qh.data(), randn(nq, 4711).data(), nq);
      const auto dout = randn(no, 4712);
      std::vector<float> bias0 = randn(3 * s.C, 4713);
      for (float& b : bias0) b += 10.0f;
      ::setenv("GPT_ATTENTION_WGMMA_BQ", bq, 1);
      auto run = [&] {
        Dev<bf16> g_qkv(*gpu, qh), g_out(*gpu, no), g_dqkv(*gpu, nq);
        Dev<float> g_dout(*gpu, dout), g_att(*gpu, gpu->attention_state_floats(s.B, s.T, s.NH)), g_bias(*gpu, bias0);
        gpu->attention_forward(g_out.p(), g_att.p(), g_qkv.p(), s.B, s.T, s.C, s.NH, none);
        gpu->attention_backward(g_dqkv.p(), g_dout.p(), g_qkv.p(), g_out.p(), g_att.p(), s.B, s.T, s.C, s.NH, none,
                                g_bias.p());
        return std::make_tuple(g_out.read(), g_att.read(), g_dqkv.read(), g_bias.read());
      };
      const auto [out0, att0, dqkv0, bias_got] = run();
      {
        std::vector<float> wide(nq), want = bias0, mag(bias0.size());
        for (int64_t i = 0; i < nq; ++i) wide[i] = bf16_to_f32(dqkv0[i]);
        cpu().bias_backward(want.data(), wide.data(), N, 3 * s.C);
        for (size_t c = 0; c < mag.size(); ++c) {
          mag[c] = std::abs(bias0[c]);
          for (int64_t r = 0; r < N; ++r) mag[c] += std::abs(wide[r * 3 * s.C + c]);
        }
        double worst = 0;
        for (size_t c = 0; c < mag.size(); ++c) {
          const double err = std::isfinite(bias_got[c]) ? std::abs(bias_got[c] - want[c]) : INFINITY;
          worst = std::max(worst, err / (kReduction * mag[c]));
        }
        INFO("qkv bias gradient: " << worst << " of its bound");
        CHECK(worst <= 1.0);
        const testing::ScopedEnv off("GPT_ATTENTION_WGMMA_BIAS", "0");
        Dev<bf16> g_d(*gpu, dqkv0);
        Dev<float> g_sep(*gpu, bias0);
        gpu->bias_backward(g_sep.p(), g_d.p(), N, 3 * s.C);
        CHECK(std::get<3>(run()) == g_sep.read());
      }
      for (const auto& [overlap, wg2, blocks, rs, stage, ws_kv, bq_at] : variants) {
        CAPTURE(overlap, wg2, blocks, rs, stage, ws_kv, bq_at != nullptr ? bq_at : bq);
        const testing::ScopedEnv e1("GPT_ATTENTION_WGMMA_OVERLAP", overlap), e2("GPT_ATTENTION_WGMMA_WG2", wg2),
            e3("GPT_ATTENTION_WGMMA_FWD_BLOCKS", blocks), e4("GPT_ATTENTION_WGMMA_RS", rs),
            e5("GPT_ATTENTION_WGMMA_DS_STAGE", stage), e6("GPT_ATTENTION_WGMMA_WS_KV", ws_kv),
            e7("GPT_ATTENTION_WGMMA_BQ", bq_at != nullptr ? bq_at : bq);
        const auto [out1, att1, dqkv1, bias1] = run();
        CHECK(std::memcmp(out0.data(), out1.data(), out0.size() * sizeof(bf16)) == 0);
        CHECK(std::memcmp(att0.data(), att1.data(), att0.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(dqkv0.data(), dqkv1.data(), dqkv0.size() * sizeof(bf16)) == 0);
        CHECK(bias1 == bias_got);
      }
      ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
    }
  }
  gpu->set_compute_dtype(DType::kF32);
}
TEST_CASE("parity: the wgmma attention's variants give the default kernels' results bit for bit", "[cuda]") {
  check_wgmma_variants("wgmma variants", {{"1", "0", "5", "0", "1", "0"},
                                          {"0", "1", "5", "0", "1", "0"},
                                          {"1", "1", "5", "0", "1", "0"},
                                          {"0", "0", "4", "0", "1", "0"},
                                          {"0", "0", "5", "1", "1", "0"},
                                          {"0", "0", "5", "0", "0", "0"}});
}
TEST_CASE("parity: the warp-specialised wgmma dK/dV kernel gives the default kernels' results bit for bit",
          "[cuda][ws]") {
  check_wgmma_variants("wgmma warp-specialised dK/dV kernel", {{"0", "0", "5", "0", "1", "2"},
                                                               {"0", "0", "5", "kv", "1", "2"},
                                                               {"1", "1", "5", "0", "0", "2"},
                                                               {"0", "0", "5", "0", "1", "3"},
                                                               {"1", "0", "5", "0", "1", "3"},
                                                               {"0", "0", "5", "0", "1", "0", "128"},
                                                               {"1", "0", "5", "0", "1", "0", "128"}});
}

// The warp-specialised forward (GPT_ATTENTION_WGMMA_WS=2, 3: a producer warp, 2 or 3 consumer warpgroups, key tiles
// of 128 in a ring of three stages) gives the forward on key tiles of 128 (GPT_ATTENTION_WGMMA_BK=128) bit for bit:
// the same products and online softmax, scheduled otherwise (at 2 with Q's A fragments from registers, as
// GPT_ATTENTION_WGMMA_RS's forward, which the variants case holds to shared memory's bits). T 64: warpgroups without
// rows; 217 (at 3, blocks of 192 rows): rows ending before the block's last key tile; 640: five key tiles (the ring
// refilled). Where the wgmma kernels do not run both sides are the mma.sync forward.
TEST_CASE("parity: the warp-specialised wgmma forward gives the 128-key forward's out and lse bit for bit",
          "[cuda][ws]") {
  Backend* gpu = cuda_or_skip("wgmma warp-specialised forward");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  const DropoutMask none = mask(0.0f, 1);
  for (const AttentionShape s :
       {AttentionShape{2, 64, 128, 2}, AttentionShape{1, 217, 128, 2}, AttentionShape{1, 640, 128, 2}}) {
    CAPTURE(s.B, s.T);
    const int64_t nq = int64_t{s.B} * s.T * 3 * s.C, no = int64_t{s.B} * s.T * s.C;
    std::vector<bf16> qh(nq);
    cpu().cast_to_bf16(qh.data(), randn(nq, 4721).data(), nq);
    auto run = [&] {
      Dev<bf16> g_qkv(*gpu, qh), g_out(*gpu, no);
      Dev<float> g_att(*gpu, gpu->attention_state_floats(s.B, s.T, s.NH));
      gpu->attention_forward(g_out.p(), g_att.p(), g_qkv.p(), s.B, s.T, s.C, s.NH, none);
      return std::make_pair(g_out.read(), g_att.read());
    };
    const testing::ScopedEnv bk("GPT_ATTENTION_WGMMA_BK", "128");
    const auto [out0, att0] = run();
    for (const char* ws : {"2", "3"}) {
      CAPTURE(ws);
      const testing::ScopedEnv e("GPT_ATTENTION_WGMMA_WS", ws);
      const auto [out1, att1] = run();
      CHECK(std::memcmp(out0.data(), out1.data(), out0.size() * sizeof(bf16)) == 0);
      CHECK(std::memcmp(att0.data(), att1.data(), att0.size() * sizeof(float)) == 0);
    }
  }
  gpu->set_compute_dtype(DType::kF32);
}

// The causal attention kernels' tile order (kernels/cuda/tile_order.h: longest tiles first over the heads of an
// L2-sized section, the default; GPT_ATTENTION_ORDER=head, the grid as it reads) moves each block to another tile and
// head, and nothing else: every kernel family gives the head-by-head order's out, lse and dqkv bit for bit. 12 heads
// of 200 rows: 4 query tiles of 64 (2 of 128), so the blocks change both. Sections of fewer heads than the grid has
// are the emulator's case (it shrinks the L2 cache the sections are sized by).
TEST_CASE("parity: the attention kernels give the same bits in either tile order", "[cuda]") {
  Backend* gpu = cuda_or_skip("attention tile order");
  if (!gpu) return;
  struct Case {
    DType compute;
    AttentionKernel kernel;
    float p;
    const char* wgmma;  // GPT_ATTENTION_WGMMA
    const char* what;
  };
  const AttentionShape s{2, 200, 384, 6};
  const int64_t nq = int64_t{s.B} * s.T * 3 * s.C, no = int64_t{s.B} * s.T * s.C;
  for (const Case& c : {Case{DType::kF32, AttentionKernel::kAuto, 0.1f, "1", "fp32 kernels"},
                        Case{DType::kBF16, AttentionKernel::kWmma, 0.1f, "1", "wmma"},
                        Case{DType::kBF16, AttentionKernel::kAuto, 0.1f, "1", "mma.sync, dropout"},
                        Case{DType::kBF16, AttentionKernel::kAuto, 0.0f, "0", "mma.sync"},
                        Case{DType::kBF16, AttentionKernel::kAuto, 0.0f, "1", "wgmma on sm_90, else mma.sync"}}) {
    CAPTURE(c.what);
    gpu->set_compute_dtype(c.compute);
    REQUIRE(gpu->set_attention_kernel(c.kernel).is_ok());
    const testing::ScopedEnv wgmma("GPT_ATTENTION_WGMMA", c.wgmma);
    const DropoutMask drop = mask(c.p, 6161);
    const size_t es = dtype_size(c.compute);
    std::vector<float> qw = randn(nq, 96), dout = randn(no, 97);
    std::vector<bf16> qh(nq);
    cpu().cast_to_bf16(qh.data(), qw.data(), nq);
    auto run = [&](const char* order) {
      const testing::ScopedEnv e("GPT_ATTENTION_ORDER", order);
      // Outputs NaN (0xff bytes) first: a tile no block takes stays NaN, where the head-by-head order wrote it.
      Dev<unsigned char> g_q(*gpu, nq * es), g_o(*gpu, std::vector<unsigned char>(no * es, 0xff)),
          g_d(*gpu, std::vector<unsigned char>(nq * es, 0xff));
      gpu->to_device(g_q.p(), c.compute == DType::kBF16 ? static_cast<const void*>(qh.data()) : qw.data(), nq * es);
      Dev<float> g_att(*gpu, std::vector<float>(gpu->attention_state_floats(s.B, s.T, s.NH), NAN)), g_dout(*gpu, dout);
      const TensorPtr q(g_q.p(), c.compute), o(g_o.p(), c.compute), d(g_d.p(), c.compute);
      gpu->attention_forward(o, g_att.p(), q, s.B, s.T, s.C, s.NH, drop);
      gpu->attention_backward(d, g_dout.p(), q, o, g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
      return std::make_tuple(g_o.read(), g_att.read(), g_d.read());
    };
    const auto [out0, att0, dqkv0] = run("head");
    const auto [out1, att1, dqkv1] = run("lpt");
    CHECK(out0 == out1);
    CHECK(std::memcmp(att0.data(), att1.data(), att0.size() * sizeof(float)) == 0);
    CHECK(dqkv0 == dqkv1);
  }
  REQUIRE(gpu->set_attention_kernel(AttentionKernel::kAuto).is_ok());
  gpu->set_compute_dtype(DType::kF32);
}

// A bf16 output gradient (the projection GEMM's input gradient under bf16 compute) reads as its widening on every
// attention backward: dqkv bit for bit that of the fp32 dout of its values. The tensor-core kernels multiply dO
// rounded to bf16, which the widened values already are, and D sums the same values; the mma.sync backward takes the
// bf16 dout as its dO instead of rounding a copy. On the CPU too.
TEST_CASE("parity: a bf16 attention output gradient reads as its widening on every kernel", "[cuda]") {
  Backend* gpu = cuda_or_skip("attention bf16 dout");
  if (!gpu) return;
  using Shape = AttentionShape;
  struct Case {
    DType compute;
    AttentionKernel kernel;
    Shape s;
    const char* path;
  };
  // mma.sync (head sizes 64, 32), WMMA (64), and the fp32 kernels at head size 16 under both computes.
  for (const Case& c : {Case{DType::kBF16, AttentionKernel::kAuto, Shape{2, 65, 128, 2}, "mma"},
                        Case{DType::kBF16, AttentionKernel::kAuto, Shape{1, 33, 64, 2}, "mma hs 32"},
                        Case{DType::kBF16, AttentionKernel::kWmma, Shape{2, 65, 128, 2}, "wmma"},
                        Case{DType::kBF16, AttentionKernel::kAuto, Shape{2, 33, 64, 4}, "fp32 kernels, bf16 qkv"},
                        Case{DType::kF32, AttentionKernel::kAuto, Shape{2, 33, 64, 2}, "fp32 kernels"}}) {
    CAPTURE(c.path);
    gpu->set_compute_dtype(c.compute);
    REQUIRE(gpu->set_attention_kernel(c.kernel).is_ok());
    const Shape s = c.s;
    const int64_t nq = int64_t{s.B} * s.T * 3 * s.C, no = int64_t{s.B} * s.T * s.C;
    const DropoutMask drop = mask(0.1f, 5151);
    const DType t = c.compute;
    std::vector<bf16> qh(nq), dh(no);
    cpu().cast_to_bf16(qh.data(), randn(nq, 92).data(), nq);
    cpu().cast_to_bf16(dh.data(), randn(no, 93).data(), no);
    std::vector<float> qw(nq), dw(no);
    cpu().cast_from_bf16(qw.data(), qh.data(), nq);
    cpu().cast_from_bf16(dw.data(), dh.data(), no);
    const int64_t na = gpu->attention_state_floats(s.B, s.T, s.NH);
    // qkv, out and dqkv in the compute dtype, as the model stores them.
    const size_t es = dtype_size(t);
    Dev<unsigned char> g_q(*gpu, nq * es), g_o(*gpu, no * es), g_a(*gpu, nq * es), g_b(*gpu, nq * es);
    if (t == DType::kBF16) {
      gpu->to_device(g_q.p(), qh.data(), nq * es);
    } else {
      gpu->to_device(g_q.p(), qw.data(), nq * es);
    }
    Dev<float> g_att(*gpu, na), g_dw(*gpu, dw);
    Dev<bf16> g_dh(*gpu, dh);
    const TensorPtr q(g_q.p(), t), o(g_o.p(), t), da(g_a.p(), t), db(g_b.p(), t);
    gpu->attention_forward(o, g_att.p(), q, s.B, s.T, s.C, s.NH, drop);
    gpu->attention_backward(da, g_dh.p(), q, o, g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
    gpu->attention_backward(db, g_dw.p(), q, o, g_att.p(), s.B, s.T, s.C, s.NH, drop, nullptr);
    CHECK(g_a.read() == g_b.read());
  }
  REQUIRE(gpu->set_attention_kernel(AttentionKernel::kAuto).is_ok());
  gpu->set_compute_dtype(DType::kF32);
  // The CPU's (fp32 tensors, the probabilities kept) the same way.
  const Shape s{2, 17, 64, 2};
  const int64_t nq = int64_t{s.B} * s.T * 3 * s.C, no = int64_t{s.B} * s.T * s.C;
  const auto q = randn(nq, 94);
  std::vector<bf16> dh(no);
  cpu().cast_to_bf16(dh.data(), randn(no, 95).data(), no);
  std::vector<float> dw(no), out(no), att(cpu().attention_state_floats(s.B, s.T, s.NH)), da(nq), db(nq);
  cpu().cast_from_bf16(dw.data(), dh.data(), no);
  cpu().attention_forward(out.data(), att.data(), q.data(), s.B, s.T, s.C, s.NH, mask(0.1f, 5152));
  cpu().attention_backward(da.data(), dh.data(), q.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH,
                           mask(0.1f, 5152), nullptr);
  cpu().attention_backward(db.data(), dw.data(), q.data(), out.data(), att.data(), s.B, s.T, s.C, s.NH,
                           mask(0.1f, 5152), nullptr);
  CHECK(da == db);
}

// Scores far from 0: qkv of standard deviation 6 gives scores q.k / sqrt(hs) of standard deviation 36, so the
// largest in a row are past 100 (exp overflows fp32 at 88.7) and a row's running max moves by tens as the key tiles
// go by. An online softmax that rescales its sums or its output wrongly when the max moves, or takes exp before
// subtracting the max, is off by O(1) here while unit-variance inputs can hide it. And head size 96, which no
// tensor-core kernel takes: the fp32 kernels zero-pad it to 128, under fp32 and bf16 compute alike.
TEST_CASE("parity: attention of large scores, and head size 96", "[cuda]") {
  Backend* gpu = cuda_or_skip("attention edges");
  if (!gpu) return;
  using Shape = AttentionShape;
  const std::vector<Shape> large = {Shape{1, 70, 128, 2}, Shape{2, 64, 64, 1}, Shape{1, 33, 256, 2}};
  const std::vector<Shape> hs96 = {Shape{1, 1, 96, 1}, Shape{2, 45, 192, 2}, Shape{1, 130, 96, 1}};
  for (const float p : {0.0f, 0.25f}) {
    CAPTURE(p);
    for (const Shape s : large) {
      CAPTURE(s.B, s.T, s.C, s.NH);
      compare_attention(*gpu, s, mask(p, 77), 40, kReduction, "large-score attention", 6.0f);
    }
    for (const Shape s : hs96) {
      CAPTURE(s.B, s.T, s.C, s.NH);
      compare_attention(*gpu, s, mask(p, 78), 41, kReduction, "hs96 attention");
    }
  }
  // bf16 compute, both tensor-core kernels (mma.sync, then WMMA). qkv are bf16 values, so the scores are exact products
  // summed in fp32 as on the CPU, and the output stays within the tensor-core case's 2e-2. The gradients do not: a
  // row's softmax is nearly one-hot here, so dS = P (dP - D) cancels for its dominant key, and the bf16 roundings of
  // O (stored), dO and P (each 2^-9 of values about |v| |dO|) stay whole in it; every query adds its share into its
  // keys' gradients. The emulator measures 3.5e-2 of the largest element for both kernels alike (2.4e-2 with dO given
  // in bf16); 6e-2 still fails a wrong rescale of the running sums, which is off by O(1).
  gpu->set_compute_dtype(DType::kBF16);
  for (const AttentionKernel kernel : {AttentionKernel::kAuto, AttentionKernel::kWmma}) {
    REQUIRE(gpu->set_attention_kernel(kernel).is_ok());
    for (const Shape s : large) {
      CAPTURE(static_cast<int>(kernel), s.B, s.T, s.C, s.NH);
      compare_attention_bf16(*gpu, s, mask(0.25f, 79), 42, 6e-2, "large-score tc attention", 6.0f);
    }
  }
  REQUIRE(gpu->set_attention_kernel(AttentionKernel::kAuto).is_ok());
  for (const Shape s : hs96) {  // the fp32 kernels on bf16 tensors: the bf16 outputs round once (2^-9 < 4e-3)
    CAPTURE(s.B, s.T, s.C, s.NH);
    compare_attention_bf16(*gpu, s, mask(0.25f, 80), 43, 4e-3, "hs96 bf16 attention");
  }
  gpu->set_compute_dtype(DType::kF32);
}

// Sampling's attention over a KV cache: the rows from t0 of one sequence. Head sizes 8, 64, 96 and 128; T past one
// and two of the kernel's 128-key chunks (the online softmax rescales between them), t0 for a prompt (every row),
// half of it, and one token; scores of deviation 1 and 36 (qkv of deviation 6: past exp's range). bf16: qkv in bf16
// (the model's cache under bf16 compute), the output rounded once (2^-9 < 4e-3).
TEST_CASE("parity: attention over a KV cache", "[cuda]") {
  Backend* gpu = cuda_or_skip("KV-cache attention");
  if (!gpu) return;
  struct Shape {
    int T, C, NH;
  };
  for (const Shape s : {Shape{1, 8, 1}, Shape{37, 128, 2}, Shape{300, 192, 2}, Shape{130, 256, 2}}) {
    for (const float scale : {1.0f, 6.0f}) {
      const int64_t nq = int64_t{s.T} * 3 * s.C;
      const auto qkv = randn(nq, 50, scale);
      std::vector<bf16> qh(nq);
      cpu().cast_to_bf16(qh.data(), qkv.data(), nq);
      std::vector<float> qw(nq);
      cpu().cast_from_bf16(qw.data(), qh.data(), nq);
      Dev<float> g_qkv(*gpu, qkv);
      Dev<bf16> g_qh(*gpu, qh);
      for (const int t0 : {0, s.T / 2, s.T - 1}) {
        CAPTURE(s.T, s.C, s.NH, scale, t0);
        const int64_t no = int64_t{s.T - t0} * s.C;
        std::vector<float> want(no), want_lo(no);
        cpu().attention_forward_rows(want.data(), qkv.data(), s.T, t0, s.C, s.NH);
        cpu().attention_forward_rows(want_lo.data(), qw.data(), s.T, t0, s.C, s.NH);
        Dev<float> g_out(*gpu, no);
        Dev<bf16> g_oh(*gpu, no);
        gpu->attention_forward_rows(g_out.p(), g_qkv.p(), s.T, t0, s.C, s.NH);
        gpu->attention_forward_rows(g_oh.p(), g_qh.p(), s.T, t0, s.C, s.NH);
        // Scores near 100 differ by a few of their ulps (7.6e-6 at 100) with the order of the sums, and exp turns
        // those into relative errors of the same size: 3e-5 there (the emulator measures 1.1e-5).
        expect_close("kv attention", want, g_out.read(), scale > 1.0f ? 3e-5 : kReduction);
        std::vector<float> got_lo(no);
        const auto oh = g_oh.read();
        cpu().cast_from_bf16(got_lo.data(), oh.data(), no);
        expect_close("kv attention bf16", want_lo, got_lo, 4e-3);
      }
    }
  }
}

// The PTX probe (tests/kernels/mma_probe.h): the instructions under the mma.sync attention, alone. Every value is
// exact (small integers: every product and sum fits fp32), so each output must match its table bit for bit. When
// the attention cases above fail on a GPU and this passes, the fault is in a kernel, not in an instruction's layout.
TEST_CASE("PTX probe: mma.sync, ldmatrix, cvt.bf16x2 and cp.async follow the PTX ISA's fragment tables", "[cuda]") {
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
  if (cuda_or_skip("PTX probe") == nullptr) return;
  uint32_t state = 12345u;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  auto small = [&] { return static_cast<float>(static_cast<int>(next() >> 24) % 9 - 4); };  // -4 .. 4
  auto bits = [](float x) { return f32_to_bf16(x).bits; };
  auto value = [](uint16_t b) { return bf16_to_f32(bf16{b}); };
  cuda_probe::MmaProbeIn in;
  for (auto* m : {&in.a, &in.b, &in.kt}) {
    for (int e = 0; e < 256; ++e) m->push_back(bits(small()));
  }
  for (int e = 0; e < 128; ++e) in.c.push_back(2.0f * small());
  for (int e = 0; e < 256; ++e) in.codes.push_back(static_cast<uint16_t>(0x1000 + e));  // (row, column) in the bits
  for (int l = 0; l < 16; ++l) {
    in.lo.push_back(1.0f + static_cast<float>(l) / 1024.0f);  // lane 4: 1 + 2^-8, a tie (to even: 1)
    in.hi.push_back(-3.0f - static_cast<float>(l) / 512.0f - 1.0f / 4096.0f);
  }
  // Lanes 16-31: NaNs with payloads, infinities, zeros, subnormals (a tie among them), the largest finite values
  // (rounding to infinity), ties either way; hi the same list turned by 5, so NaNs meet numbers in a pair.
  const uint32_t special[16] = {0x7fc00000u, 0x7f812345u, 0xffc00001u, 0x7f800000u, 0xff800000u, 0x00000000u,
                                0x80000000u, 0x00000001u, 0x00018000u, 0x807fffffu, 0x7f7fffffu, 0x7f7f8000u,
                                0x3f808000u, 0x3f818000u, 0xc0a08001u, 0x3effffffu};
  for (int l = 0; l < 16; ++l) {
    in.lo.push_back(std::bit_cast<float>(special[l]));
    in.hi.push_back(std::bit_cast<float>(special[(l + 5) % 16]));
  }
  for (int e = 0; e < 256; ++e) in.copy.push_back(static_cast<uint16_t>(next() >> 16));
  const cuda_probe::MmaProbeOut out = cuda_probe::run_mma_probe(in);

  // Mismatches against `want`, the first one printed.
  auto show = [](auto v) {
    char buf[64];
    if constexpr (std::is_same_v<decltype(v), float>) {
      std::snprintf(buf, sizeof buf, "%g (0x%08x)", static_cast<double>(v), std::bit_cast<uint32_t>(v));
    } else {
      std::snprintf(buf, sizeof buf, "0x%x", static_cast<unsigned>(v));
    }
    return std::string(buf);
  };
  auto mismatches = [&](const char* what, const auto& got, const auto& want) {
    REQUIRE(got.size() == want.size());
    int n = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(got[i])) != 0 && n++ == 0) {
        std::printf("PTX probe: %s: first difference at %zu: got %s, want %s\n", what, i, show(got[i]).c_str(),
                    show(want[i]).c_str());
      }
    }
    return n;
  };
  // D = A B + C, n-tile by n-tile, with B from b (k x n) or from kt^T.
  auto product = [&](bool from_kt) {
    std::vector<float> d(256);
    for (int nt = 0; nt < 2; ++nt) {
      for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 8; ++c) {
          const int n = 8 * nt + c;
          double s = in.c[static_cast<size_t>(r * 8 + c)];
          for (int k = 0; k < 16; ++k) {
            s += static_cast<double>(value(in.a[static_cast<size_t>(r * 16 + k)])) *
                 value(from_kt ? in.kt[static_cast<size_t>(n * 16 + k)] : in.b[static_cast<size_t>(k * 16 + n)]);
          }
          d[static_cast<size_t>((nt * 16 + r) * 8 + c)] = static_cast<float>(s);
        }
      }
    }
    return d;
  };
  CHECK(mismatches("mma.sync, fragments by the tables", out.d_direct, product(false)) == 0);
  CHECK(mismatches("mma.sync, ldmatrix A and ldmatrix.trans B", out.d_trans, product(false)) == 0);
  CHECK(mismatches("mma.sync, ldmatrix A and ldmatrix B (kt^T)", out.d_kt, product(true)) == 0);
  // ldmatrix: register m of lane 4 r + q from matrix m (rows 8 (m % 2).., columns 8 (m / 2).. of the codes).
  std::vector<uint32_t> ld, ld_trans;
  for (int lane = 0; lane < 32; ++lane) {
    const int r = lane / 4, q = lane % 4;
    for (int m = 0; m < 4; ++m) {
      auto code = [&](int row, int col) {
        return static_cast<uint32_t>(in.codes[static_cast<size_t>((8 * (m % 2) + row) * 16 + 8 * (m / 2) + col)]);
      };
      ld.push_back(code(r, 2 * q) | code(r, 2 * q + 1) << 16);
      ld_trans.push_back(code(2 * q, r) | code(2 * q + 1, r) << 16);
    }
  }
  CHECK(mismatches("ldmatrix.x4", out.ld, ld) == 0);
  CHECK(mismatches("ldmatrix.x4.trans", out.ld_trans, ld_trans) == 0);
  // Both against f32_to_bf16 (bf16_bits_nearest); pack_bf16x2 (the attention's) only where no NaN is in the pair
  // (cvt gives the canonical NaN), bf16x2_nearest (every kernel's bf16 store) everywhere.
  std::vector<uint32_t> nearest, packed_got, packed_want;
  for (size_t l = 0; l < 32; ++l) {
    nearest.push_back(static_cast<uint32_t>(bits(in.lo[l])) | static_cast<uint32_t>(bits(in.hi[l])) << 16);
    if (!std::isnan(in.lo[l]) && !std::isnan(in.hi[l])) {
      packed_want.push_back(nearest.back());
      packed_got.push_back(out.packed[l]);
    }
  }
  REQUIRE(packed_want.size() >= 16);
  CHECK(mismatches("cvt.rn.bf16x2.f32 (lo in the low half)", packed_got, packed_want) == 0);
  CHECK(mismatches("bf16x2_nearest (cvt; NaNs by the integer path)", out.nearest, nearest) == 0);
  std::vector<uint16_t> copied(in.copy);
  for (int lane = 1; lane < 32; lane += 2) std::fill_n(copied.begin() + 8 * lane, 8, uint16_t{0});
  CHECK(mismatches("cp.async (16 bytes, or zero-filled)", out.copied, copied) == 0);
#else
  std::printf("SKIPPED PTX probe: built without CUDA\n");
#endif
}

// The wgmma probe (tests/kernels/wgmma_probe.h): wgmma m64n64k16 over 128-byte-swizzled shared tiles, alone, on an
// sm_90 GPU (the instruction exists there only) or in the emulator. Exact as above (small integers).
TEST_CASE("wgmma probe: descriptors, swizzle and fragments follow the PTX ISA's tables", "[cuda]") {
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
  if (cuda_or_skip("wgmma probe") == nullptr) return;
  if (!cuda_probe::wgmma_probe_supported()) {
    std::printf("SKIPPED wgmma probe: the GPU is not sm_90 (wgmma is an sm_90a instruction)\n");
    return;
  }
  uint32_t state = 777u;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  auto small = [&] { return static_cast<float>(static_cast<int>(next() >> 24) % 7 - 3); };  // -3 .. 3
  auto value = [](uint16_t b) { return bf16_to_f32(bf16{b}); };
  cuda_probe::WgmmaProbeIn in;
  for (auto* m : {&in.a, &in.kt, &in.v, &in.at}) {
    for (int e = 0; e < 4096; ++e) m->push_back(f32_to_bf16(small()).bits);
  }
  const cuda_probe::WgmmaProbeOut out = cuda_probe::run_wgmma_probe(in);
  // D = A B over k < 64 for n < N: A = a (or at^T), B = kt^T (or v).
  auto check = [&](const char* what, const std::vector<float>& got, int N, bool from_at, bool from_v) {
    REQUIRE(got.size() == static_cast<size_t>(64 * N));
    int wrong = 0;
    for (int m = 0; m < 64; ++m) {
      for (int n = 0; n < N; ++n) {
        double want = 0.0;
        for (int k = 0; k < 64; ++k) {
          want += static_cast<double>(
                      value(from_at ? in.at[static_cast<size_t>(k * 64 + m)] : in.a[static_cast<size_t>(m * 64 + k)])) *
                  value(from_v ? in.v[static_cast<size_t>(k * 64 + n)] : in.kt[static_cast<size_t>(n * 64 + k)]);
        }
        const float g = got[static_cast<size_t>(m * N + n)];
        if (g != static_cast<float>(want) && wrong++ < 4) {
          std::printf("wgmma probe: %s: D[%d][%d] = %g, want %g\n", what, m, n, static_cast<double>(g), want);
        }
      }
    }
    return wrong;
  };
  CHECK(check("A, K-major B^T from shared memory (S = Q K^T)", out.d_ss, 64, false, false) == 0);
  CHECK(check("A from registers, MN-major B (O = P V)", out.d_rs, 64, false, true) == 0);
  CHECK(check("m64n32k16, K-major A and B^T from shared memory", out.d_32, 32, false, false) == 0);
  CHECK(check("MN-major A and B from shared memory (dQ = dS K from dS^T)", out.d_tt, 64, true, true) == 0);
#else
  std::printf("SKIPPED wgmma probe: built without CUDA\n");
#endif
}

// The mbarrier probe (tests/kernels/mbarrier_probe.h): the warp-specialised kernels' synchronisation alone, on an
// sm_90 GPU or in the emulator. [ws]: scripts/gpu/check.sh runs it with the warp-specialised cases, apart (a wait that
// never ends there would otherwise take the other cases' step with it). When those cases fail and this passes, the
// fault is in a kernel, not in mbarrier_ptx.cuh.
TEST_CASE("mbarrier probe: a producer warp's ring of stages, and named barriers, as mbarrier_ptx.cuh says",
          "[cuda][ws]") {
#if defined(GPT_PARITY_EMULATED) || defined(GPT_WITH_CUDA)
  if (cuda_or_skip("mbarrier probe") == nullptr) return;
  if (!cuda_probe::wgmma_probe_supported()) {
    std::printf("SKIPPED mbarrier probe: the GPU is not sm_90 (the probe is built for sm_90a)\n");
    return;
  }
  std::vector<float> src(128 * cuda_probe::kMbarrierProbeTiles);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i) + 0.25f;
  const cuda_probe::MbarrierProbeOut out = cuda_probe::run_mbarrier_probe(src);
  CHECK(out.copied == src);  // every tile's cp.async landed before its consumers' reads
  std::vector<float> stored;
  for (int t = 0; t < cuda_probe::kMbarrierProbeTiles; ++t) {
    for (int w = 0; w < 4; ++w) {
      for (int lane = 0; lane < 32; ++lane) stored.push_back(static_cast<float>(t * 1000 + (lane ^ w)));
    }
  }
  CHECK(out.stored == stored);  // the producer's plain stores, released by its arrival
  CHECK(out.named == std::vector<float>{3.0f, 4.0f, 5.0f, 2.0f, 77.0f, 77.0f, 77.0f, 77.0f});
#else
  std::printf("SKIPPED mbarrier probe: built without CUDA\n");
#endif
}

TEST_CASE("parity: gelu, residual, dropout", "[cuda]") {
  Backend* gpu = cuda_or_skip("elementwise");
  if (!gpu) return;
  const int64_t n = 10007;
  auto x = randn(n, 40, 3.0f), r = randn(n, 41), d = randn(n, 42);
  Dev<float> gx(*gpu, x), gr(*gpu, r), gd(*gpu, d), gy(*gpu, n);
  std::vector<float> y(n);
  cpu().gelu_forward(y.data(), x.data(), n);
  gpu->gelu_forward(gy.p(), gx.p(), n);
  expect_close("gelu forward", y, gy.read(), kElementwise);
  {  // a bf16 output is the fp32 one rounded, bit for bit
    Dev<bf16> glo(*gpu, n);
    gpu->gelu_forward(glo.p(), gx.p(), n);
    std::vector<bf16> want(n);
    cpu().cast_to_bf16(want.data(), gy.read().data(), n);
    const std::vector<bf16> got = glo.read();
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(bf16)) == 0);
  }
  cpu().gelu_backward(y.data(), x.data(), d.data(), n);
  gpu->gelu_backward(gy.p(), gx.p(), gd.p(), n);
  expect_close("gelu backward", y, gy.read(), kElementwise);
  {  // a bf16 input (the fc GEMM's bf16 output) reads as its fp32 widening, bit for bit
    std::vector<bf16> xh(n);
    cpu().cast_to_bf16(xh.data(), x.data(), n);
    std::vector<float> xw(n);
    cpu().cast_from_bf16(xw.data(), xh.data(), n);
    Dev<bf16> gxh(*gpu, xh);
    Dev<float> gxw(*gpu, xw), ga(*gpu, n), gb(*gpu, n);
    gpu->gelu_forward(ga.p(), gxh.p(), n);
    gpu->gelu_forward(gb.p(), gxw.p(), n);
    CHECK(ga.read() == gb.read());
    gpu->gelu_backward(ga.p(), gxh.p(), gd.p(), n);
    gpu->gelu_backward(gb.p(), gxw.p(), gd.p(), n);
    CHECK(ga.read() == gb.read());
    // A bf16 output gradient (the projection GEMM's bf16 input gradient) reads as its widening too, and a bf16
    // result in place over it (the model's d4) is the separate one's, bit for bit.
    std::vector<bf16> dh(n);
    cpu().cast_to_bf16(dh.data(), d.data(), n);
    std::vector<float> dw(n);
    cpu().cast_from_bf16(dw.data(), dh.data(), n);
    Dev<bf16> gdh(*gpu, dh), gio(*gpu, dh), glo(*gpu, n);
    Dev<float> gdw(*gpu, dw);
    gpu->gelu_backward(ga.p(), gxh.p(), gdh.p(), n);
    gpu->gelu_backward(gb.p(), gxh.p(), gdw.p(), n);
    CHECK(ga.read() == gb.read());
    gpu->gelu_backward(glo.p(), gxh.p(), gdh.p(), n);
    gpu->gelu_backward(gio.p(), gxh.p(), gio.p(), n);
    const std::vector<bf16> separate = glo.read(), in_place = gio.read();
    CHECK(std::memcmp(in_place.data(), separate.data(), separate.size() * sizeof(bf16)) == 0);
    std::vector<bf16> want(n);
    cpu().cast_to_bf16(want.data(), ga.read().data(), n);
    CHECK(std::memcmp(separate.data(), want.data(), want.size() * sizeof(bf16)) == 0);
    // The CPU backend's the same: its bf16 result in place over a bf16 dout.
    std::vector<bf16> cio = dh, cwant(n);
    std::vector<float> cx(n);
    cpu().cast_from_bf16(cx.data(), xh.data(), n);
    cpu().gelu_backward(cio.data(), xh.data(), cio.data(), n);
    std::vector<float> cy(n);
    cpu().gelu_backward(cy.data(), cx.data(), dw.data(), n);
    cpu().cast_to_bf16(cwant.data(), cy.data(), n);
    CHECK(std::memcmp(cio.data(), cwant.data(), cwant.size() * sizeof(bf16)) == 0);
  }
  for (float p : {0.0f, 0.3f, 0.95f, 0.999f}) {  // near 1: nearly all dropped, the kept ones scaled by up to 1000
    CAPTURE(p);
    const DropoutMask drop = mask(p, 77);
    cpu().residual_forward(y.data(), r.data(), x.data(), n, drop);
    gpu->residual_forward(gy.p(), gr.p(), gx.p(), n, drop);
    expect_close("residual", y, gy.read(), kElementwise);
    cpu().dropout_backward(y.data(), d.data(), n, drop);
    gpu->dropout_backward(gy.p(), gd.p(), n, drop);
    REQUIRE(gy.read() == y);  // the same mask, the same multiply
    std::vector<float> xi = x;
    Dev<float> gxi(*gpu, x);
    cpu().dropout_forward(xi.data(), n, drop);
    gpu->dropout_forward(gxi.p(), n, drop);
    REQUIRE(gxi.read() == xi);
  }
}

// GELU (tanh) far out, where tanh saturates: the forward is x or 0 and the backward 1 or 0, with no overflow of
// x^3 or of a cosh/exp into inf * 0 = NaN; each element within 1e-6 of its own CPU value (the usual comparison
// scales by the largest element, which would hide errors at the small ones beside 1e4).
TEST_CASE("parity: GELU at large |x|", "[cuda]") {
  Backend* gpu = cuda_or_skip("gelu edges");
  if (!gpu) return;
  const float far[] = {10.0f, 30.0f, 100.0f, 1e3f, 1e4f, 3e4f, 0.5f};
  std::vector<float> x;
  for (int i = 0; i < 1003; ++i) x.push_back((i % 2 ? -1.0f : 1.0f) * far[i % 7] * (1.0f + 0.001f * (i % 5)));
  const auto n = static_cast<int64_t>(x.size());
  const auto d = randn(n, 43);
  std::vector<float> y(n), dx(n);
  cpu().gelu_forward(y.data(), x.data(), n);
  cpu().gelu_backward(dx.data(), x.data(), d.data(), n);
  Dev<float> gx(*gpu, x), gd(*gpu, d), gy(*gpu, n), gdx(*gpu, n);
  gpu->gelu_forward(gy.p(), gx.p(), n);
  gpu->gelu_backward(gdx.p(), gx.p(), gd.p(), n);
  const std::vector<float> got_y = gy.read(), got_dx = gdx.read();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool ok_y = std::abs(got_y[i] - y[i]) <= 1e-6f * std::max(1.0f, std::abs(y[i]));
    const bool ok_dx = std::abs(got_dx[i] - dx[i]) <= 1e-6f * std::max(1.0f, std::abs(dx[i]));
    const bool saturated = std::abs(x[i]) >= 10.0f;
    const bool limit =
        !saturated || (x[i] > 0 ? got_y[i] == x[i] && got_dx[i] == d[i] : got_y[i] == 0.0f && got_dx[i] == 0.0f);
    if (!ok_y || !ok_dx || !limit) {
      if (wrong++ < 5)
        UNSCOPED_INFO("x " << x[i] << ": gelu " << got_y[i] << " (cpu " << y[i] << "), grad " << got_dx[i] << " (cpu "
                           << dx[i] << ", dout " << d[i] << ")");
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("parity: cross-entropy with padded vocab, in place", "[cuda]") {
  Backend* gpu = cuda_or_skip("crossentropy");
  if (!gpu) return;
  for (const auto& [V, Vp] : {std::pair<int, int>{5, 5}, {65, 67}, {50257, 50304}}) {
    CAPTURE(V, Vp);
    const int64_t N = V > 1000 ? 9 : 33;
    auto logits = randn(N * Vp, 50, 4.0f);
    auto targets = rand_tokens(N, V, 51);
    std::vector<float> losses(N), dl = logits, losses_only(N);
    cpu().crossentropy_forward_backward(losses_only.data(), nullptr, logits.data(), targets.data(), N, V, Vp, 0.0f);
    cpu().crossentropy_forward_backward(losses.data(), dl.data(), dl.data(), targets.data(), N, V, Vp, 0.125f);
    Dev<float> g_logits(*gpu, logits), g_losses(*gpu, N);
    Dev<int32_t> g_targets(*gpu, targets);
    gpu->crossentropy_forward_backward(g_losses.p(), nullptr, g_logits.p(), g_targets.p(), N, V, Vp, 0.0f);
    expect_close("cross-entropy losses (forward only)", losses_only, g_losses.read(), kReduction);
    REQUIRE(g_logits.read() == logits);  // untouched without dlogits
    gpu->crossentropy_forward_backward(g_losses.p(), g_logits.p(), g_logits.p(), g_targets.p(), N, V, Vp, 0.125f);
    expect_close("cross-entropy losses", losses, g_losses.read(), kReduction);
    expect_close("cross-entropy dlogits (in place)", dl, g_logits.read(), kReduction);
    // bf16 dlogits (the LM head's GEMM input under bf16 compute): the fp32 ones rounded, bit for bit.
    Dev<float> g_fresh(*gpu, logits), g_losses2(*gpu, N);
    Dev<bf16> g_lo(*gpu, logits.size());
    gpu->crossentropy_forward_backward(g_losses2.p(), g_lo.p(), g_fresh.p(), g_targets.p(), N, V, Vp, 0.125f);
    std::vector<bf16> want(logits.size());
    cpu().cast_to_bf16(want.data(), g_logits.read().data(), static_cast<int64_t>(want.size()));
    const std::vector<bf16> got = g_lo.read();
    CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(bf16)) == 0);
    REQUIRE(g_losses2.read() == g_losses.read());
  }
}

// Logits a kernel's max-subtraction or exp can get wrong: magnitudes near 1e4 (exp would overflow without the max),
// a constant row (loss log V, every probability 1/V), and targets at the vocabulary's ends and at a row's largest
// and smallest logit; fp32 logits and their bf16 roundings.
TEST_CASE("parity: cross-entropy of large logits, a constant row, targets at the vocabulary's ends", "[cuda]") {
  Backend* gpu = cuda_or_skip("crossentropy edges");
  if (!gpu) return;
  const int V = 50257, Vp = 50304;
  const int64_t N = 5;
  auto logits = randn(N * Vp, 52, 1e4f);
  std::fill(logits.begin(), logits.begin() + Vp, 3.0f);  // row 0: constant
  auto targets = rand_tokens(N, V, 53);
  targets[0] = V - 1;
  targets[1] = 0;
  targets[2] = static_cast<int32_t>(std::max_element(logits.begin() + 2 * Vp, logits.begin() + 2 * Vp + V) -
                                    (logits.begin() + 2 * Vp));
  targets[3] = static_cast<int32_t>(std::min_element(logits.begin() + 3 * Vp, logits.begin() + 3 * Vp + V) -
                                    (logits.begin() + 3 * Vp));
  for (const bool round : {false, true}) {
    CAPTURE(round);
    const std::vector<float> in = round ? rounded(logits) : logits;
    std::vector<float> losses(N), dl = in;
    cpu().crossentropy_forward_backward(losses.data(), dl.data(), dl.data(), targets.data(), N, V, Vp, 0.5f);
    CHECK(std::abs(losses[0] - std::log(static_cast<float>(V))) < 1e-4f);
    Dev<float> g_logits(*gpu, in), g_losses(*gpu, N);
    Dev<int32_t> g_targets(*gpu, targets);
    gpu->crossentropy_forward_backward(g_losses.p(), g_logits.p(), g_logits.p(), g_targets.p(), N, V, Vp, 0.5f);
    const std::vector<float> got_losses = g_losses.read(), got_dl = g_logits.read();
    CHECK(std::all_of(got_losses.begin(), got_losses.end(), [](float v) { return std::isfinite(v); }));
    CHECK(std::all_of(got_dl.begin(), got_dl.end(), [](float v) { return std::isfinite(v); }));
    expect_close("large cross-entropy losses", losses, got_losses, kReduction);
    expect_close("large cross-entropy dlogits", dl, got_dl, kReduction);
  }
}

// The LM head as the model runs it: logit rows Gpt::logits_stride(V) apart (GPT-2's odd vocabulary padded, so
// cuBLASLt takes aligned kernels), the forward writing the first V columns, the backward reading no others (NaN
// there would show); under bf16 compute the logits are the GEMM's bf16 output and the cross-entropy reads them
// widened and writes its bf16 gradient over them.
TEST_CASE("parity: the LM head's GEMMs over padded logit rows, and cross-entropy of bf16 logits", "[cuda]") {
  Backend* gpu = cuda_or_skip("padded LM head");
  if (!gpu) return;
  for (const int V : {65, 50257}) {
    if (!gpu_sized_shapes() && V > 1000) continue;  // GPT-2's head, on a GPU only
    const int64_t N = 33, Vp = Gpt::logits_stride(V);
    const int C = 64;
    CAPTURE(V, Vp);
    auto real = [&](const std::vector<float>& rows) {  // the first V columns of rows Vp apart
      std::vector<float> r;
      for (int64_t i = 0; i < N; ++i) r.insert(r.end(), rows.begin() + i * Vp, rows.begin() + i * Vp + V);
      return r;
    };
    const auto x = randn(N * C, 90), w = randn(int64_t{V} * C, 91), dw0 = randn(int64_t{V} * C, 92);
    auto dout = randn(N * Vp, 93);
    for (int64_t i = 0; i < N; ++i) std::fill(dout.begin() + i * Vp + V, dout.begin() + (i + 1) * Vp, NAN);
    for (const bool lo : {false, true}) {
      CAPTURE(lo);
      gpu->set_compute_dtype(lo ? DType::kBF16 : DType::kF32);
      // The CPU in fp32 on the values the GPU's GEMMs take (bf16-rounded under bf16 compute).
      const auto xc = lo ? rounded(x) : x, wc = lo ? rounded(w) : w, dc = lo ? rounded(dout) : dout;
      std::vector<float> out(N * Vp, NAN), dx(N * C), dw = dw0;
      cpu().matmul_forward(out.data(), xc.data(), wc.data(), nullptr, N, C, V, Vp);
      cpu().matmul_backward(dx.data(), dw.data(), nullptr, dc.data(), xc.data(), wc.data(), N, C, V, Vp);
      Dev<float> g_x(*gpu, x), g_w(*gpu, w), g_dout(*gpu, dout), g_dw(*gpu, dw0), g_dx(*gpu, dx.size());
      gpu->matmul_backward(g_dx.p(), g_dw.p(), nullptr, g_dout.p(), g_x.p(), g_w.p(), N, C, V, Vp);
      expect_close("padded head dinp", dx, g_dx.read(), kReduction);
      expect_close("padded head dweight", dw, g_dw.read(), kReduction);
      if (!lo) {
        Dev<float> g_out(*gpu, std::vector<float>(N * Vp, NAN));
        gpu->matmul_forward(g_out.p(), g_x.p(), g_w.p(), nullptr, N, C, V, Vp);
        expect_close("padded head logits", real(out), real(g_out.read()), kReduction);
        continue;
      }
      // bf16 logits: the fp32 sums rounded once (within the fp32 bound plus a bf16 place of the CPU's, rounded).
      Dev<bf16> g_logits(*gpu, N * Vp);
      gpu->matmul_forward(g_logits.p(), g_x.p(), g_w.p(), nullptr, N, C, V, Vp);
      const std::vector<bf16> logits = g_logits.read();
      std::vector<bf16> logits_real;
      for (int64_t i = 0; i < N; ++i) {
        logits_real.insert(logits_real.end(), logits.begin() + i * Vp, logits.begin() + i * Vp + V);
      }
      const std::vector<float> want = real(out);
      CHECK(bf16_worst(want, logits_real, kReduction * max_abs(want)) <= 1.0);
      // The cross-entropy of those bf16 logits, in place, against the CPU's on their widened values; and bit for
      // bit the GPU's own on the widened values (bf16 dlogits of its own).
      std::vector<float> widened(N * Vp);
      for (size_t i = 0; i < widened.size(); ++i) widened[i] = bf16_to_f32(logits[i]);
      const auto targets = rand_tokens(N, V, 94);
      std::vector<float> c_losses(N), c_dl(N * Vp);
      cpu().crossentropy_forward_backward(c_losses.data(), c_dl.data(), widened.data(), targets.data(), N, V,
                                          static_cast<int>(Vp), 0.125f);
      Dev<int32_t> g_targets(*gpu, targets);
      Dev<float> g_losses(*gpu, N), g_losses_w(*gpu, N), g_widened(*gpu, widened);
      Dev<bf16> g_dl_w(*gpu, N * Vp);
      gpu->crossentropy_forward_backward(g_losses.p(), g_logits.p(), g_logits.p(), g_targets.p(), N, V,
                                         static_cast<int>(Vp), 0.125f);
      gpu->crossentropy_forward_backward(g_losses_w.p(), g_dl_w.p(), g_widened.p(), g_targets.p(), N, V,
                                         static_cast<int>(Vp), 0.125f);
      expect_close("cross-entropy of bf16 logits: losses", c_losses, g_losses.read(), kReduction);
      REQUIRE(g_losses.read() == g_losses_w.read());
      const std::vector<bf16> dl = g_logits.read(), dl_w = g_dl_w.read();
      CHECK(std::memcmp(dl.data(), dl_w.data(), dl.size() * sizeof(bf16)) == 0);
      std::vector<float> dl_f(dl.size());
      for (size_t i = 0; i < dl.size(); ++i) dl_f[i] = bf16_to_f32(dl[i]);
      expect_close("cross-entropy of bf16 logits: dlogits", rounded(c_dl), dl_f, 1.0 / 128);
    }
    gpu->set_compute_dtype(DType::kF32);
  }
}

// GPT_CE_ROW_IN_SMEM=1 (the cross-entropy's rows kept in shared memory between its two passes where a bf16 row fits)
// gives the streaming kernel's losses and dlogits bit for bit: GPT-2's padded vocabulary, a short row, an odd row
// length (unaligned rows: the streaming kernel's scalar loads against aligned shared ones), -inf logits and a target
// in a row's last group, in place and into other memory (bf16 and fp32 dlogits), losses alone; and a row too long for
// it (the other kernel).
TEST_CASE("parity: the cross-entropy with its rows in shared memory gives the streaming kernel's values bit for bit",
          "[cuda]") {
  Backend* gpu = cuda_or_skip("crossentropy row in shared memory");
  if (!gpu) return;
  struct Shape {
    int64_t N;
    int V, Vp;
  };
  // 24576 columns first: 48 KB of dynamic shared memory, over the 48 KB a block gets without the opt-in beside its
  // static 128 bytes (first, before a longer row's opt-in, which stays with the kernel, covers it).
  for (const Shape sh : {Shape{2, 24576, 24576}, Shape{3, 50257, 50304}, Shape{5, 1000, 1024}, Shape{4, 37, 37},
                         Shape{2, 60000, 60000}}) {
    CAPTURE(sh.N, sh.V, sh.Vp);
    const int64_t n = sh.N * sh.Vp;
    std::vector<float> raw = randn(n, 4242, 3.0f);
    raw[5] = -INFINITY;  // row 0
    raw[static_cast<size_t>(sh.Vp) + 1] = -INFINITY;
    const std::vector<bf16> logits = to_bf16(raw);
    auto targets = rand_tokens(sh.N, sh.V, 4243);
    targets[0] = sh.V - 1;  // the last column: the row's last group
    Dev<int32_t> g_targets(*gpu, targets);
    auto run = [&](bool smem) {
      if (smem) ::setenv("GPT_CE_ROW_IN_SMEM", "1", 1);
      Dev<bf16> g_logits(*gpu, logits), g_other(*gpu, n);
      Dev<float> g_loss_only(*gpu, sh.N), g_loss_in(*gpu, sh.N), g_loss_out(*gpu, sh.N), g_loss32(*gpu, sh.N);
      Dev<float> g_other32(*gpu, n);  // fp32 dlogits of the bf16 logits
      gpu->crossentropy_forward_backward(g_loss32.p(), g_other32.p(), g_logits.p(), g_targets.p(), sh.N, sh.V, sh.Vp,
                                         0.25f);
      gpu->crossentropy_forward_backward(g_loss_only.p(), nullptr, g_logits.p(), g_targets.p(), sh.N, sh.V, sh.Vp,
                                         0.0f);
      gpu->crossentropy_forward_backward(g_loss_out.p(), g_other.p(), g_logits.p(), g_targets.p(), sh.N, sh.V, sh.Vp,
                                         0.25f);
      gpu->crossentropy_forward_backward(g_loss_in.p(), g_logits.p(), g_logits.p(), g_targets.p(), sh.N, sh.V, sh.Vp,
                                         0.25f);
      ::unsetenv("GPT_CE_ROW_IN_SMEM");
      return std::make_tuple(g_loss_only.read(), g_loss_out.read(), g_other.read(), g_loss_in.read(), g_logits.read(),
                             g_other32.read());
    };
    const auto [only0, out0, other0, in0, inplace0, other32_0] = run(false);
    const auto [only1, out1, other1, in1, inplace1, other32_1] = run(true);
    auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    CHECK(same(only0, only1));
    CHECK(same(out0, out1));
    CHECK(same(other0, other1));
    CHECK(same(in0, in1));
    CHECK(same(inplace0, inplace1));
    CHECK(same(other0, inplace0));
    CHECK(same(other32_0, other32_1));
    CHECK(std::isfinite(out0[1]));
  }
}

TEST_CASE("parity: multi-tensor adamw with the bf16 copy, spans' sum of squares and rounding", "[cuda]") {
  Backend* gpu = cuda_or_skip("multi-tensor optimizer ops");
  if (!gpu) return;
  const int64_t n = 300000;
  // Spans as AdamW builds them: decayed and not, gaps (padding) between, one over many 4096-element tiles; the last
  // with its bf16 copy 1 element on (lo_shift, as ZeRO-1/2's blocks of the gathered parameters), into the padding.
  const std::vector<OptimSpan> spans = {
      {0, 700, 0, false}, {700, 200000, 700, true}, {200704, 0, 3, true}, {200800, 99199, 900000, false, 1}};
  auto p = randn(n, 70), m = randn(n, 71, 0.1f), g = randn(n, 73);
  std::vector<float> v = randn(n, 72);
  for (float& x : v) x = x * x;
  for (const bool stochastic : {false, true}) {
    CAPTURE(stochastic);
    Bf16Rounding r;
    r.stochastic = stochastic;
    r.rng = CounterRng(3, 4);
    std::vector<float> cp = p, cm = m, cv = v;
    std::vector<bf16> clo(n, bf16{0x1234});
    Dev<float> gp(*gpu, p), gm(*gpu, m), gv(*gpu, v), gg(*gpu, g);
    Dev<bf16> glo(*gpu, clo);
    for (int64_t step : {1, 2, 10}) {
      const AdamWStep s{3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step};
      cpu().adamw_update_spans(cp.data(), cm.data(), cv.data(), g.data(), clo.data(), spans, s, r);
      gpu->adamw_update_spans(gp.p(), gm.p(), gv.p(), gg.p(), glo.p(), spans, s, r);
    }
    const auto gp_h = gp.read();
    expect_close("adamw_spans param", cp, gp_h, kElementwise);
    expect_close("adamw_spans m", cm, gm.read(), kElementwise);
    expect_close("adamw_spans v", cv, gv.read(), kElementwise);
    // The bf16 copy is the rounding of the GPU's own master weights (outside the spans: untouched).
    std::vector<bf16> want(n, bf16{0x1234});
    for (const OptimSpan& sp : spans) cpu().round_to_bf16_spans(want.data(), gp_h.data(), {sp}, r);
    const auto glo_h = glo.read();
    REQUIRE(std::memcmp(glo_h.data(), want.data(), n * sizeof(bf16)) == 0);
    Dev<bf16> glo2(*gpu, std::vector<bf16>(n, bf16{0x1234}));
    gpu->round_to_bf16_spans(glo2.p(), gp.p(), spans, r);
    const auto glo2_h = glo2.read();
    REQUIRE(std::memcmp(glo2_h.data(), want.data(), n * sizeof(bf16)) == 0);
    // The same spans but for one lo_shift are another table (the backend keeps one per list of spans).
    std::vector<OptimSpan> unshifted = spans;
    unshifted.back().lo_shift = 0;
    std::vector<bf16> want3(n, bf16{0x1234});
    cpu().round_to_bf16_spans(want3.data(), gp_h.data(), unshifted, r);
    Dev<bf16> glo3(*gpu, std::vector<bf16>(n, bf16{0x1234}));
    gpu->round_to_bf16_spans(glo3.p(), gp.p(), unshifted, r);
    const auto glo3_h = glo3.read();
    REQUIRE(std::memcmp(glo3_h.data(), want3.data(), n * sizeof(bf16)) == 0);
    const double s_cpu = cpu().sum_squares_spans(g.data(), spans), s_gpu = gpu->sum_squares_spans(gg.p(), spans);
    CHECK(std::abs(s_cpu - s_gpu) <= 1e-12 * s_cpu);
    CHECK(gpu->sum_squares_spans(gg.p(), spans) == s_gpu);
    CHECK(gpu->sum_squares_spans(gg.p(), {}) == 0.0);
  }
}

// Spans at the multi-tensor kernels' tile edges (4096 elements a block): one short of a tile, exactly one
// (starting off a tile's edge), one over (its last tile one element long), exactly two (with a bf16 copy shifted
// by one), a single element; fresh moments (the first step's zeros, as the trainer starts) and gradients that are
// zero over whole spans (a frozen or unused parameter: the update is 0 / (0 + eps) = 0, plus weight decay).
TEST_CASE("parity: multi-tensor adamw over spans at the tile edges, zero gradients and fresh moments", "[cuda]") {
  Backend* gpu = cuda_or_skip("adamw tile edges");
  if (!gpu) return;
  const int64_t n = 20600;
  const std::vector<OptimSpan> spans = {{0, 4095, 0, true},
                                        {4095, 4096, 5000, false},
                                        {8192, 4097, 9000, true},
                                        {12300, 8192, 20000, true, 1},
                                        {20500, 1, 30000, false}};
  const auto p = randn(n, 80);
  std::vector<float> g = randn(n, 81);
  for (const int zeroed : {1, 3}) std::fill_n(g.begin() + spans[zeroed].begin, spans[zeroed].length, 0.0f);
  for (const bool stochastic : {false, true}) {
    CAPTURE(stochastic);
    Bf16Rounding r;
    r.stochastic = stochastic;
    r.rng = CounterRng(5, 6);
    std::vector<float> cp = p, cm(n, 0.0f), cv(n, 0.0f);
    std::vector<bf16> clo(n, bf16{0x1234});
    Dev<float> gp(*gpu, p), gm(*gpu, cm), gv(*gpu, cv), gg(*gpu, g);
    Dev<bf16> glo(*gpu, clo);
    for (int64_t step : {1, 2, 3}) {
      CAPTURE(step);
      const AdamWStep s{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, step};
      cpu().adamw_update_spans(cp.data(), cm.data(), cv.data(), g.data(), clo.data(), spans, s, r);
      gpu->adamw_update_spans(gp.p(), gm.p(), gv.p(), gg.p(), glo.p(), spans, s, r);
      const auto gp_h = gp.read();
      expect_close("adamw edges param", cp, gp_h, kElementwise);
      expect_close("adamw edges m", cm, gm.read(), kElementwise);
      expect_close("adamw edges v", cv, gv.read(), kElementwise);
      // Zero gradients: m and v stay exactly 0, and the weights only decay (decayed spans) or stay (the others).
      const auto gm_h = gm.read(), gv_h = gv.read();
      for (const int zeroed : {1, 3}) {
        const OptimSpan& sp = spans[zeroed];
        for (int64_t i = sp.begin; i < sp.begin + sp.length; ++i) {
          if (gm_h[i] != 0.0f || gv_h[i] != 0.0f || !std::isfinite(gp_h[i]))
            FAIL("span " << zeroed << " element " << i);
          if (!sp.decay && gp_h[i] != p[i]) FAIL("span " << zeroed << " (no decay, zero gradient) moved at " << i);
        }
      }
      // (A tile the kernel skipped would keep its old values: off by about lr, far past the bound above.) The
      // padding between spans is never written.
      for (const int64_t i : {int64_t{12291}, int64_t{20499}, n - 1}) CHECK(gp_h[i] == p[i]);
    }
    // The bf16 copy is the rounding of the GPU's own master weights, inside the spans only.
    std::vector<bf16> want(n, bf16{0x1234});
    const auto gp_h = gp.read();
    for (const OptimSpan& sp : spans) cpu().round_to_bf16_spans(want.data(), gp_h.data(), {sp}, r);
    const auto glo_h = glo.read();
    REQUIRE(std::memcmp(glo_h.data(), want.data(), n * sizeof(bf16)) == 0);
    // The sum of squares over the zero spans is exactly 0; over all, the CPU's.
    CHECK(gpu->sum_squares_spans(gg.p(), {spans[1], spans[3]}) == 0.0);
    const double s_cpu = cpu().sum_squares_spans(g.data(), spans), s_gpu = gpu->sum_squares_spans(gg.p(), spans);
    CHECK(std::abs(s_cpu - s_gpu) <= 1e-12 * s_cpu);
  }
}

TEST_CASE("parity: adamw, sum of squares, fill, copy, bf16 casts", "[cuda]") {
  Backend* gpu = cuda_or_skip("optimizer and memory ops");
  if (!gpu) return;
  const int64_t n = 100003;
  auto p = randn(n, 60), m = randn(n, 61, 0.1f), g = randn(n, 63);
  std::vector<float> v = randn(n, 62);
  for (float& x : v) x = x * x;  // second moments are non-negative
  Dev<float> gp(*gpu, p), gm(*gpu, m), gv(*gpu, v), gg(*gpu, g);
  for (int64_t step : {1, 2, 10}) {
    cpu().adamw_update(p.data(), m.data(), v.data(), g.data(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step);
    gpu->adamw_update(gp.p(), gm.p(), gv.p(), gg.p(), n, 3e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, step);
  }
  expect_close("adamw param", p, gp.read(), kElementwise);
  expect_close("adamw m", m, gm.read(), kElementwise);
  expect_close("adamw v", v, gv.read(), kElementwise);
  const double s_cpu = cpu().sum_squares(g.data(), n), s_gpu = gpu->sum_squares(gg.p(), n);
  CHECK(std::abs(s_cpu - s_gpu) <= 1e-12 * s_cpu);  // double accumulation: order barely matters
  CHECK(gpu->sum_squares(gg.p(), n) == s_gpu);
  CHECK(gpu->sum_squares(gg.p(), 0) == 0.0);

  std::vector<float> special = {0.0f, -0.0f, 1.0f, 1.00390625f, 1.005859375f, 3.0e38f, -1e-40f, INFINITY, NAN};
  auto x = randn(n, 64, 100.0f);
  x.insert(x.end(), special.begin(), special.end());
  std::vector<bf16> lo(x.size());
  cpu().cast_to_bf16(lo.data(), x.data(), static_cast<int64_t>(x.size()));
  Dev<float> gx(*gpu, x);
  Dev<bf16> glo(*gpu, x.size());
  gpu->cast_to_bf16(glo.p(), gx.p(), static_cast<int64_t>(x.size()));
  const auto glo_h = glo.read();
  REQUIRE(std::memcmp(glo_h.data(), lo.data(), lo.size() * sizeof(bf16)) == 0);  // round to nearest even, bit for bit
  std::vector<float> back(x.size());
  cpu().cast_from_bf16(back.data(), lo.data(), static_cast<int64_t>(x.size()));
  Dev<float> gback(*gpu, x.size());
  gpu->cast_from_bf16(gback.p(), glo.p(), static_cast<int64_t>(x.size()));
  const auto gback_h = gback.read();
  REQUIRE(std::memcmp(gback_h.data(), back.data(), back.size() * sizeof(float)) == 0);

  Dev<float> gc(*gpu, x.size());
  gpu->copy(gc.p(), gx.p(), static_cast<int64_t>(x.size()));
  const auto copied = gc.read();
  REQUIRE(std::memcmp(copied.data(), x.data(), x.size() * sizeof(float)) == 0);
  gpu->fill_zero(gc.p(), static_cast<int64_t>(x.size()));
  for (float f : gc.read()) REQUIRE(f == 0.0f);
}

// GPT-2 init of every unit, concatenated in layout order.
std::vector<float> init_weights(const ModelLayout& layout, const GptShape& shape, uint64_t seed = 5) {
  std::vector<float> weights;
  for (const UnitLayout& u : layout.units) {
    std::vector<float> w(u.numel);
    init_unit_slice(u, shape, seed, 0, u.numel, w.data());
    weights.insert(weights.end(), w.begin(), w.end());
  }
  return weights;
}

// All parameters and gradients in one buffer of the backend: the simplest ParamSource. `bf16_params`: the
// parameters held as bf16 only (the weights rounded), as ShardedParams holds them under param_dtype bf16 and bf16
// compute (else fp32, which bf16 GEMMs cast).
class FlatParams final : public ParamSource {
 public:
  FlatParams(Backend& be, const ModelLayout& layout, const std::vector<float>& weights, bool bf16_params = false) {
    grads_ = be.alloc(weights.size() * sizeof(float), MemCategory::kGrads);
    if (bf16_params) {
      std::vector<bf16> lo(weights.size());
      for (size_t i = 0; i < lo.size(); ++i) lo[i] = f32_to_bf16(weights[i]);
      lo_ = be.alloc(lo.size() * sizeof(bf16), MemCategory::kParams);
      be.to_device(lo_.data(), lo.data(), lo.size() * sizeof(bf16));
    } else {
      params_ = be.alloc(weights.size() * sizeof(float), MemCategory::kParams);
      be.to_device(params_.data(), weights.data(), weights.size() * sizeof(float));
    }
    int64_t at = 0;
    for (const UnitLayout& u : layout.units) {
      offsets_.push_back(at);
      at += u.numel;
    }
  }
  ConstTensorPtr acquire(int unit) override {
    if (!lo_.empty()) return lo_.as<bf16>() + offsets_[unit];
    return params_.as<float>() + offsets_[unit];
  }
  void release(int) override {}
  float* grads(int unit) override { return grads_.as<float>() + offsets_[unit]; }
  void grads_done(int) override {}
  Buffer& grad_buffer() { return grads_; }

 private:
  std::vector<int64_t> offsets_;
  Buffer params_, grads_, lo_;
};

// fp32: 1e-4 (the issue's bound). bf16 compute (GEMM and attention inputs, P, dS): each rounding is within 2^-9
// relative, and a forward and backward pass through 3 blocks compounds a few dozen of them, so the loss is held to 1e-2
// relative and each gradient tensor to 5e-2 of its largest element: enough to catch a wrong transpose or a missing term
// (errors of order 1), not the rounding. Under bf16 the GPU holds the parameters in bf16 only, as ShardedParams does
// (the CPU takes their fp32 values). The GELU fused into the GEMMs (run.gelu_fusion) rounds differently, within the
// same bounds; its gradients differ from the unfused ones (the epilogues ran).
TEST_CASE("parity: a whole GPT forward and backward on CUDA matches the CPU (fp32 within 1e-4, bf16)", "[cuda]") {
  Backend* gpu = cuda_or_skip("GPT step");
  if (!gpu) return;
  std::vector<float> unfused;  // the bf16 run's GPU gradients without fusion
  for (const auto& [dropout, matmul, fusion] :
       {std::tuple{0.0f, DType::kF32, GeluFusion::kNone}, std::tuple{0.1f, DType::kF32, GeluFusion::kNone},
        std::tuple{0.1f, DType::kBF16, GeluFusion::kNone}, std::tuple{0.1f, DType::kBF16, GeluFusion::kForward},
        std::tuple{0.1f, DType::kBF16, GeluFusion::kFull}}) {
    CAPTURE(dropout, dtype_name(matmul), static_cast<int>(fusion));
    gpu->set_compute_dtype(matmul);
    REQUIRE(gpu->set_gelu_fusion(fusion).is_ok());
    const double loss_tol = matmul == DType::kF32 ? 1e-4 : 1e-2, grad_tol = matmul == DType::kF32 ? 1e-4 : 5e-2;
    GptShape shape{3, 4, 128, 32, 97, dropout};  // head size 32: bf16 takes the tensor-core attention
    const ModelLayout layout = ModelLayout::build(shape);
    const bool lo = matmul == DType::kBF16;
    const std::vector<float> weights = lo ? rounded(init_weights(layout, shape)) : init_weights(layout, shape);
    const int B = 3, T = 29;
    const auto inputs = rand_tokens(B * T, shape.vocab_size, 70), targets = rand_tokens(B * T, shape.vocab_size, 71);
    const StepContext ctx{11, 2, 0, true};
    float loss[2];
    std::vector<float> grads[2];
    Backend* backends[2] = {&cpu(), gpu};
    for (int i = 0; i < 2; ++i) {
      Gpt model(shape, *backends[i]);
      if (dropout > 0.0f) model.set_head_rows(32);  // the LM head in chunks of 32, 32 and 23 rows
      model.prepare(B, T);
      FlatParams params(*backends[i], model.layout(), weights, /*bf16_params=*/lo && i == 1);
      loss[i] = model.forward_backward(params, inputs.data(), targets.data(), 1.0f / (B * T), ctx);
      grads[i].resize(weights.size());
      backends[i]->to_host(grads[i].data(), params.grad_buffer().data(), weights.size() * sizeof(float));
    }
    CHECK(std::abs(loss[0] - loss[1]) <= loss_tol * std::abs(loss[0]));
    int64_t at = 0;
    for (const UnitLayout& u : layout.units) {
      for (const ParamSpec& p : u.params) {
        const std::vector<float> a(grads[0].begin() + at + p.offset, grads[0].begin() + at + p.offset + p.numel);
        const std::vector<float> b(grads[1].begin() + at + p.offset, grads[1].begin() + at + p.offset + p.numel);
        expect_close(u.name + "." + p.name + " gradient", a, b, grad_tol);
      }
      at += u.numel;
    }
    if (lo && fusion == GeluFusion::kNone) unfused = grads[1];
    if (fusion != GeluFusion::kNone) CHECK(grads[1] != unfused);
  }
  REQUIRE(gpu->set_gelu_fusion(GeluFusion::kNone).is_ok());
  gpu->set_compute_dtype(DType::kF32);
}

// A fresh CUDA backend under GPT_TRAIN_CUDA_PROFILE=1 (which it reads once, when made).
Expected<std::unique_ptr<Backend>> make_profiling_gpu() {
  ::setenv("GPT_TRAIN_CUDA_PROFILE", "1", 1);
  auto made = make_gpu();
  ::unsetenv("GPT_TRAIN_CUDA_PROFILE");
  return made;
}

// The model takes both fused ops under full: a fresh backend under GPT_TRAIN_CUDA_PROFILE=1 lists the ops it ran
// (times aside), and no GELU kernel is among them.
TEST_CASE("GELU fusion: a GPT step under full runs both fused GEMMs and no GELU kernel", "[cuda]") {
  if (!cuda_or_skip("GELU fusion in the model")) return;
  auto made = make_profiling_gpu();
  REQUIRE(made.has_value());
  Backend& be = **made;
  be.set_compute_dtype(DType::kBF16);
  REQUIRE(be.set_gelu_fusion(GeluFusion::kFull).is_ok());
  const GptShape shape{1, 2, 64, 16, 97, 0.0f};
  const ModelLayout layout = ModelLayout::build(shape);
  Gpt model(shape, be);
  model.prepare(2, 16);
  FlatParams params(be, model.layout(), init_weights(layout, shape), /*bf16_params=*/true);
  const auto tokens = rand_tokens(32, shape.vocab_size, 157), targets = rand_tokens(32, shape.vocab_size, 158);
  (void)model.forward_backward(params, tokens.data(), targets.data(), 1.0f / 32, StepContext{11, 0, 0, true});
  const std::string report = be.profile_report();
  INFO(report);
  CHECK(report.find("matmul_gelu_forward") != std::string::npos);
  CHECK(report.find("matmul_backward_gelu") != std::string::npos);
  CHECK(report.find("\n  gelu_forward ") == std::string::npos);  // a line of its own, not matmul_gelu_forward
  CHECK(report.find("\n  gelu_backward ") == std::string::npos);
}

// GPT_TRAIN_CUDA_PROFILE=1 records events around each op without waiting and reads them where the host waits
// anyway: every call is counted, whether read at a synchronize, when the event pool fills up (16384 events, 8192
// ops) or at the report.
TEST_CASE("CUDA profile: every op call is counted, read at a synchronize, a full pool and the report", "[cuda]") {
  if (!cuda_or_skip("CUDA op profile")) return;
  auto made = make_profiling_gpu();
  REQUIRE(made.has_value());
  Backend& be = **made;
  Dev<float> x(be, std::vector<float>(64, 1.0f)), y(be, 64);
  for (int i = 0; i < 3; ++i) be.copy(y.p(), x.p(), 64);
  be.synchronize();
  for (int i = 0; i < 8200; ++i) be.copy(y.p(), x.p(), 64);
  be.fill_zero(y.p(), 64);
  constexpr int kN = 64, kC = 32, kOC = 48;
  Dev<float> inp(be, randn(kN * kC, 1)), weight(be, randn(kOC * kC, 2)), out(be, kN * kOC);
  for (int i = 0; i < 2; ++i) be.matmul_forward(out.p(), inp.p(), weight.p(), nullptr, kN, kC, kOC, kOC);
  be.dropout_forward(y.p(), 64, DropoutMask{});  // inactive: no kernel, no work
  const std::string report = be.profile_report();
  INFO(report);
  // An op's line split at blanks: op, total ms, calls, ms/call, %, then its least work per call (a number and its
  // unit, or '-' for none) and the rate ('-' where there is no work or no time).
  auto fields = [&](const std::string& op) {
    const size_t at = report.find("\n  " + op + " ");
    if (at == std::string::npos) return std::vector<std::string>{};
    std::istringstream line(report.substr(at + 1, report.find('\n', at + 1) - at - 1));
    return std::vector<std::string>{std::istream_iterator<std::string>(line), {}};
  };
  const auto copy = fields("copy"), fill = fields("fill_zero"), gemm = fields("matmul_forward_64_32_48"),
             dropout = fields("dropout_forward");
  REQUIRE(copy.size() >= 8);
  REQUIRE(fill.size() >= 7);
  REQUIRE(gemm.size() >= 8);
  REQUIRE(dropout.size() == 7);
  CHECK(copy[2] == "8203");
  CHECK(fill[2] == "1");
  // The rates' work: a copy of 64 floats reads and writes 512 bytes; the GEMM (its line named by N, C, OC) does
  // 2 N C OC operations.
  CHECK(copy[6] == "MB");
  CHECK(std::stod(copy[5]) == Approx(512e-6).epsilon(1e-3));
  CHECK(gemm[2] == "2");
  CHECK(gemm[6] == "GFLOP");
  CHECK(std::stod(gemm[5]) == Approx(2.0 * kN * kC * kOC * 1e-9).epsilon(1e-3));
  CHECK(dropout[5] == "-");              // no work (and so no rate)
  CHECK(be.profile_report() == report);  // read once: a second report adds nothing
  // profile_restart forgets what came before it (the trainer's first step), pending ops too.
  be.copy(y.p(), x.p(), 64);
  be.profile_restart();
  be.fill_zero(y.p(), 64);
  const std::string after = be.profile_report();
  INFO(after);
  CHECK(after.find("\n  copy ") == std::string::npos);
  CHECK(after.find("\n  matmul_forward") == std::string::npos);
  const size_t fill_at = after.find("\n  fill_zero ");
  REQUIRE(fill_at != std::string::npos);
  std::istringstream fill_line(after.substr(fill_at + 1));
  std::string op, total_ms, calls;
  fill_line >> op >> total_ms >> calls;
  CHECK(calls == "1");  // the one after the restart
}

// ARCHITECTURE invariant 4 on the GPU: Gpt::prepare reserves the backend's scratch and cast areas
// (Backend::reserve, from the sizes the planner uses), so not even the first step allocates (under bf16, with bf16
// parameters, as ShardedParams hands them; with dropout, so the residual gradient's cast area is there).
TEST_CASE("CUDA: after Gpt::prepare, forward and backward allocate no device memory", "[cuda]") {
  if (!cuda_or_skip("workspace reserve")) return;
  for (const DType compute : {DType::kF32, DType::kBF16}) {
    CAPTURE(dtype_name(compute));
    auto fresh = make_gpu();  // its own, empty areas
    REQUIRE(fresh.has_value());
    Backend& gpu = **fresh;
    gpu.set_compute_dtype(compute);
    GptShape shape{2, 4, 128, 32, 97, 0.1f};
    const ModelLayout layout = ModelLayout::build(shape);
    const std::vector<float> weights = init_weights(layout, shape);
    const int B = 3, T = 29;
    const auto inputs = rand_tokens(B * T, shape.vocab_size, 80), targets = rand_tokens(B * T, shape.vocab_size, 81);
    Gpt model(shape, gpu);
    model.prepare(B, T);
    FlatParams params(gpu, model.layout(), weights, /*bf16_params=*/compute == DType::kBF16);
    const int64_t before = MemTracker::instance().stats().allocations;
    for (int64_t step = 0; step < 2; ++step) {
      (void)model.forward_backward(params, inputs.data(), targets.data(), 1.0f / (B * T),
                                   StepContext{11, step, 0, true});
    }
    (void)model.forward_loss(params, inputs.data(), targets.data(), StepContext{11, 0, 0, false});
    CHECK(MemTracker::instance().stats().allocations == before);
  }
}

TEST_CASE("activation checkpointing on CUDA: the same loss and gradients, bit for bit", "[cuda]") {
  Backend* gpu = cuda_or_skip("activation checkpointing");
  if (!gpu) return;
  const GptShape shape{4, 4, 64, 32, 97, 0.1f};
  const ModelLayout layout = ModelLayout::build(shape);
  const std::vector<float> weights = init_weights(layout, shape, 9);
  const int B = 2, T = 32;
  const auto inputs = rand_tokens(B * T, shape.vocab_size, 90), targets = rand_tokens(B * T, shape.vocab_size, 91);
  const StepContext ctx{3, 1, 0, true};
  std::vector<float> reference;
  float reference_loss = 0.0f;
  for (const char* mode : {"none", "full", "every:2", "selective"}) {
    CAPTURE(mode);
    auto ckpt = ActivationCheckpointing::parse(mode);
    REQUIRE(ckpt.has_value());
    Gpt model(shape, *gpu, *ckpt);
    model.prepare(B, T);
    FlatParams params(*gpu, model.layout(), weights);
    const float loss = model.forward_backward(params, inputs.data(), targets.data(), 1.0f / (B * T), ctx);
    std::vector<float> grads(weights.size());
    gpu->to_host(grads.data(), params.grad_buffer().data(), grads.size() * sizeof(float));
    if (reference.empty()) {
      reference = grads;
      reference_loss = loss;
      continue;
    }
    REQUIRE(loss == reference_loss);
    REQUIRE(grads == reference);
  }
}

// GPT_GEMM_WGRAD_STREAM=1 (kernels.h, Matmul): each backward's weight and bias gradients on a second stream beside
// its input gradient. The same kernels on the same inputs, so the loss and the gradients (accumulated over two
// micro-batches, a second forward between them) are the default's bit for bit: fp32, and bf16 with the GELU epilogues
// and fp32 parameters (the GEMM inputs cast into the cast areas the next GEMM reuses). In the emulator this runs twice:
// the side stream's work as soon as queued (a missing fork reads inputs not yet written) and deferred like the main
// stream's (a missing join leaves the gradients unwritten when they are read).
TEST_CASE("GPT_GEMM_WGRAD_STREAM=1: weight gradients on a second stream, the same loss and gradients bit for bit",
          "[cuda]") {
  Backend* gpu = cuda_or_skip("weight-gradient stream");
  if (!gpu) return;
  const GptShape shape{3, 4, 64, 32, 97, 0.0f};
  const ModelLayout layout = ModelLayout::build(shape);
  const std::vector<float> weights = init_weights(layout, shape, 17);
  const int B = 2, T = 32;
  const auto inputs = rand_tokens(2 * B * T, shape.vocab_size, 94),
             targets = rand_tokens(2 * B * T, shape.vocab_size, 95);
  auto run = [&](Backend& be, DType compute) {
    be.set_compute_dtype(compute);
    REQUIRE(be.set_gelu_fusion(compute == DType::kBF16 ? GeluFusion::kFull : GeluFusion::kNone).is_ok());
    Gpt model(shape, be, *ActivationCheckpointing::parse("selective"));
    model.prepare(B, T);
    FlatParams params(be, model.layout(), weights);
    std::vector<float> out(weights.size() + 2);
    for (int micro = 0; micro < 2; ++micro) {
      const int64_t at = int64_t{micro} * B * T;
      out[weights.size() + micro] =
          model.forward_backward(params, inputs.data() + at, targets.data() + at, 1.0f / (2 * B * T),
                                 StepContext{5, 1, int64_t{micro} * B, true});
    }
    be.to_host(out.data(), params.grad_buffer().data(), weights.size() * sizeof(float));
    REQUIRE(be.set_gelu_fusion(GeluFusion::kNone).is_ok());
    be.set_compute_dtype(DType::kF32);
    return out;  // the gradients, then the two losses
  };
  for (const DType compute : {DType::kF32, DType::kBF16}) {
    CAPTURE(dtype_name(compute));
    const std::vector<float> reference = run(*gpu, compute);
    for (const char* early : {"1", "0"}) {
      if (!kEmulated && std::string_view(early) == "0") continue;
      CAPTURE(early);
      auto made = [&] {
        const testing::ScopedEnv run_early("EMU_RUN_EARLY", early), stream("GPT_GEMM_WGRAD_STREAM", "1");
        return make_gpu();
      }();
      REQUIRE(made.has_value());
      // Its own cuBLASLt workspace among the buffers every plan counts (the trainer's budget takes them as free):
      // two workspaces and sum_squares' double (256 bytes as cudaMalloc rounds it).
      CHECK((*made)->device_memory()->backend_bytes == 2 * static_cast<int64_t>(cuda_workspace::kCublasLtBytes) + 256);
      const std::vector<float> got = run(**made, compute);
      CHECK(got[weights.size()] == reference[weights.size()]);
      CHECK(got[weights.size() + 1] == reference[weights.size() + 1]);
      size_t differ = 0;
      for (size_t i = 0; i < weights.size(); ++i) differ += got[i] != reference[i];
      CHECK(differ == 0);
    }
  }
}

// Under bf16 compute the model stores the GEMM-only activations (LayerNorm and GELU outputs) in bf16, which the
// GEMMs take as they are: bit for bit what they computed from fp32 copies they cast themselves.
TEST_CASE("bf16 compute on CUDA: GEMM inputs stored in bf16 give the fp32-storage results bit for bit", "[cuda]") {
  Backend* gpu = cuda_or_skip("bf16 GEMM inputs");
  if (!gpu) return;
  gpu->set_compute_dtype(DType::kBF16);
  const GptShape shape{2, 4, 64, 32, 97, 0.1f};
  const ModelLayout layout = ModelLayout::build(shape);
  const std::vector<float> weights = init_weights(layout, shape, 13);
  const int B = 3, T = 29;  // 87 rows: the head's chunks of 32 start at rows not 16-byte aligned in bf16
  const auto inputs = rand_tokens(B * T, shape.vocab_size, 92), targets = rand_tokens(B * T, shape.vocab_size, 93);
  const StepContext ctx{3, 1, 0, true};
  for (const char* mode : {"none", "selective"}) {
    CAPTURE(mode);
    float loss[2];
    std::vector<float> grads[2];
    int64_t act_bytes[2];
    for (const DType stored : {DType::kF32, DType::kBF16}) {
      const int i = stored == DType::kBF16;
      Gpt model(shape, *gpu, *ActivationCheckpointing::parse(mode));
      model.set_head_rows(32);
      model.set_gemm_input_dtype(stored);
      const int64_t before = MemTracker::instance().stats().current[static_cast<size_t>(MemCategory::kActivations)];
      model.prepare(B, T);
      act_bytes[i] = MemTracker::instance().stats().current[static_cast<size_t>(MemCategory::kActivations)] - before;
      FlatParams params(*gpu, model.layout(), weights);
      loss[i] = model.forward_backward(params, inputs.data(), targets.data(), 1.0f / (B * T), ctx);
      grads[i].resize(weights.size());
      gpu->to_host(grads[i].data(), params.grad_buffer().data(), weights.size() * sizeof(float));
    }
    CHECK(loss[1] == loss[0]);
    CHECK(grads[1] == grads[0]);
    CHECK(act_bytes[1] < act_bytes[0]);
  }
  gpu->set_compute_dtype(DType::kF32);
}

}  // namespace
}  // namespace gpt
