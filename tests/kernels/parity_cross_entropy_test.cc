// Backend parity of the fused cross-entropy: padded vocabularies, in place, large and constant logits, the LM
// head's GEMMs over padded rows, bf16 logits, and the shared-memory row variant (GPT_CE_ROW_IN_SMEM).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/parity_util.h"
#include "model/gpt.h"

namespace gpt {
namespace {

using namespace parity;

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

}  // namespace
}  // namespace gpt
