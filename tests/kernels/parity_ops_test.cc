// Backend parity of the element-wise ops, the embedding, LayerNorm (with the fused residual) and AdamW: CPU
// against CUDA on the same random inputs (the tolerances are parity_util.h's).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/parity_util.h"

namespace gpt {
namespace {

using namespace parity;

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

}  // namespace
}  // namespace gpt
