// Backend parity of the GEMMs: fp32 and bf16 matmuls, unaligned operands, the timed algorithms and their cache
// file, and the GELU epilogues (run.gelu_fusion, GPT_GEMM_DGELU_BGRAD).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "kernels/parity_util.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"
#ifdef GPT_PARITY_EMULATED
#include "cublasLt.h"  // the emulator's: emu_lt_no_dgelu_bgrad
#endif

namespace gpt {
namespace {

using namespace parity;

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

}  // namespace
}  // namespace gpt
