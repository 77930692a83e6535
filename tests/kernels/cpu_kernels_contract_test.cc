// The contract of backend.h checked on the CPU kernels, beyond gradients (cpu_kernels_test.cc): which
// outputs accumulate and which are overwritten, bitwise determinism, causality of attention, repeated
// tokens in embedding_backward, and adamw_update / sum_squares against direct double formulas.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/kernels.h"
#include "kernels/kernel_test_util.h"

namespace gpt {
namespace {

using testing::rand_tokens;
using testing::randn;
using Outputs = std::vector<std::vector<float>>;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
DropoutMask dropout(float p) { return DropoutMask{p, CounterRng(7, 3), 11}; }

bool bitwise_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }
bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && bitwise_equal(a.data(), b.data(), a.size());
}

// `total` is a gradient accumulated over `calls` identical backward calls, `once` the result of one.
void require_accumulated(const char* name, const std::vector<float>& once, const std::vector<float>& total,
                         float calls) {
  INFO(name);
  float scale = 0.0f;
  for (float g : once) scale = std::max(scale, std::abs(g));
  REQUIRE(scale > 0.0f);
  for (size_t i = 0; i < once.size(); ++i) REQUIRE(std::abs(total[i] - calls * once[i]) <= 1e-6f * scale);
}

// run(out) writes n outputs; they must not depend on what `out` held before.
template <class F>
void require_overwrites(const char* op, size_t n, F run) {
  INFO(op);
  std::vector<float> from_zero(n, 0.0f), from_nan(n, kNaN);
  run(from_zero.data());
  run(from_nan.data());
  REQUIRE(bitwise_equal(from_zero, from_nan));
}

// run() does one forward and backward on fresh buffers and returns all their outputs.
template <class F>
void require_repeatable(const char* op, F run) {
  INFO(op);
  const Outputs a = run(), b = run();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(bitwise_equal(a[i], b[i]));
}

TEST_CASE("parameter gradients and layernorm's dinp accumulate, other outputs are overwritten", "[kernels]") {
  const int B = 2, T = 4, C = 8, NH = 2, N = B * T, OC = 5, V = 6, Vp = 8;
  const auto inp = randn(N * C, 1), dout = randn(N * C, 2);
  SECTION("matmul: dinp overwritten, dweight and dbias accumulated") {
    const auto weight = randn(OC * C, 3), dout_oc = randn(N * OC, 4);
    std::vector<float> dweight(OC * C), dbias(OC), dinp(N * C);
    auto backward = [&](float* dx) {
      cpu::matmul_backward(dx, dweight.data(), dbias.data(), dout_oc.data(), inp.data(), weight.data(), N, C, OC);
    };
    backward(dinp.data());
    const auto dweight1 = dweight, dbias1 = dbias;
    require_overwrites("matmul dinp", N * C, backward);  // two more calls
    require_accumulated("dweight", dweight1, dweight, 3);
    require_accumulated("dbias", dbias1, dbias, 3);
  }
  SECTION("layernorm: dinp, dweight and dbias all accumulated") {
    const auto weight = randn(C, 3), bias = randn(C, 4), prefill = randn(N * C, 5);
    std::vector<float> out(N * C), mean(N), rstd(N), dweight(C), dbias(C), fresh(N * C);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    auto backward = [&](std::vector<float>& dinp) {
      cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                              mean.data(), rstd.data(), N, C);
    };
    backward(fresh);
    const auto dweight1 = dweight, dbias1 = dbias;
    std::vector<float> dinp = prefill;
    backward(dinp);
    for (int i = 0; i < N * C; ++i) REQUIRE(dinp[i] == Approx(prefill[i] + fresh[i]).epsilon(1e-6).margin(1e-6));
    require_accumulated("dweight", dweight1, dweight, 2);
    require_accumulated("dbias", dbias1, dbias, 2);
  }
  SECTION("embedding: dwte and dwpe accumulated") {
    const auto tokens = rand_tokens(N, V, 3);
    std::vector<float> dwte(V * C), dwpe(T * C);
    cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    const auto dwte1 = dwte, dwpe1 = dwpe;
    cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
    require_accumulated("dwte", dwte1, dwte, 2);
    require_accumulated("dwpe", dwpe1, dwpe, 2);
  }
  SECTION("attention, gelu, dropout and crossentropy overwrite") {
    const auto qkv = randn(N * 3 * C, 3), logits = randn(N * Vp, 4);
    const auto targets = rand_tokens(N, V, 5);
    std::vector<float> out(N * C), att(B * NH * T * T), losses(N);
    for (float p : {0.0f, 0.2f}) {
      CAPTURE(p);
      cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, dropout(p));
      require_overwrites("attention dqkv", N * 3 * C, [&](float* dqkv) {
        cpu::attention_backward(dqkv, dout.data(), qkv.data(), att.data(), B, T, C, NH, dropout(p));
      });
      require_overwrites("dropout dinp", N * C,
                         [&](float* dx) { cpu::dropout_backward(dx, dout.data(), N * C, dropout(p)); });
    }
    require_overwrites("gelu dinp", N * C, [&](float* dx) { cpu::gelu_backward(dx, inp.data(), dout.data(), N * C); });
    require_overwrites("crossentropy dlogits", N * Vp, [&](float* dz) {
      cpu::crossentropy_forward_backward(losses.data(), dz, logits.data(), targets.data(), N, V, Vp, 0.5f);
    });
  }
}

TEST_CASE("every kernel gives bitwise-identical outputs for the same inputs", "[kernels]") {
  const int B = 4, T = 16, C = 32, NH = 4, N = B * T, OC = 48, V = 50, Vp = 64;
  const auto x = randn(N * C, 1), dy = randn(N * C, 2), dy_oc = randn(N * OC, 3);
  const auto qkv = randn(N * 3 * C, 4), logits = randn(N * Vp, 5), wte = randn(V * C, 6), wpe = randn(T * C, 7);
  const auto weight = randn(OC * C, 8), bias = randn(OC, 9);
  const auto tokens = rand_tokens(N, V, 10);
  const DropoutMask drop = dropout(0.2f);
  require_repeatable("embedding", [&]() -> Outputs {
    std::vector<float> out(N * C), dwte(V * C), dwpe(T * C);
    cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    cpu::embedding_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, T, C);
    return {out, dwte, dwpe};
  });
  require_repeatable("matmul", [&]() -> Outputs {
    std::vector<float> out(N * OC), dinp(N * C), dweight(OC * C), dbias(OC);
    cpu::matmul_forward(out.data(), x.data(), weight.data(), bias.data(), N, C, OC);
    cpu::matmul_backward(dinp.data(), dweight.data(), dbias.data(), dy_oc.data(), x.data(), weight.data(), N, C, OC);
    return {out, dinp, dweight, dbias};
  });
  require_repeatable("layernorm", [&]() -> Outputs {
    std::vector<float> out(N * C), mean(N), rstd(N), dinp(N * C), dweight(C), dbias(C);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), wpe.data(), bias.data(), N, C);
    cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), dy.data(), x.data(), wpe.data(), mean.data(),
                            rstd.data(), N, C);
    return {out, mean, rstd, dinp, dweight, dbias};
  });
  require_repeatable("attention", [&]() -> Outputs {
    std::vector<float> out(N * C), att(B * NH * T * T), dqkv(N * 3 * C);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, drop);
    cpu::attention_backward(dqkv.data(), dy.data(), qkv.data(), att.data(), B, T, C, NH, drop);
    return {out, att, dqkv};
  });
  require_repeatable("gelu, residual, dropout", [&]() -> Outputs {
    std::vector<float> gelu(N * C), dgelu(N * C), res(N * C), dinp(N * C), dropped = x;
    cpu::gelu_forward(gelu.data(), x.data(), N * C);
    cpu::gelu_backward(dgelu.data(), x.data(), dy.data(), N * C);
    cpu::residual_forward(res.data(), x.data(), dy.data(), N * C, drop);
    cpu::dropout_forward(dropped.data(), N * C, drop);
    cpu::dropout_backward(dinp.data(), dy.data(), N * C, drop);
    return {gelu, dgelu, res, dropped, dinp};
  });
  require_repeatable("crossentropy", [&]() -> Outputs {
    std::vector<float> losses(N), dlogits(N * Vp);
    cpu::crossentropy_forward_backward(losses.data(), dlogits.data(), logits.data(), tokens.data(), N, V, Vp, 0.1f);
    return {losses, dlogits};
  });
  CHECK(cpu::sum_squares(qkv.data(), N * 3 * C) == cpu::sum_squares(qkv.data(), N * 3 * C));
}

TEST_CASE("the in-place forms allowed by backend.h match the out-of-place ones", "[kernels]") {
  const int N = 6, V = 5, Vp = 8;
  const auto logits = randn(N * Vp, 1), res = randn(N * Vp, 2), inp = randn(N * Vp, 3);
  const auto targets = rand_tokens(N, V, 4);
  std::vector<float> losses(N), dlogits(N * Vp), in_place = logits;
  cpu::crossentropy_forward_backward(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp, 0.5f);
  std::vector<float> losses2(N);
  cpu::crossentropy_forward_backward(losses2.data(), in_place.data(), in_place.data(), targets.data(), N, V, Vp, 0.5f);
  CHECK(bitwise_equal(losses, losses2));
  CHECK(bitwise_equal(dlogits, in_place));
  std::vector<float> out(N * Vp), out_is_res = res;
  cpu::residual_forward(out.data(), res.data(), inp.data(), N * Vp, dropout(0.2f));
  cpu::residual_forward(out_is_res.data(), out_is_res.data(), inp.data(), N * Vp, dropout(0.2f));
  CHECK(bitwise_equal(out, out_is_res));
}

TEST_CASE("attention output at row t does not depend on rows after t", "[kernels]") {
  const int B = 2, T = 6, C = 8, NH = 2;
  const auto qkv = randn(B * T * 3 * C, 1), other = randn(B * T * 3 * C, 2);
  for (float p : {0.0f, 0.2f}) {
    CAPTURE(p);
    std::vector<float> out(B * T * C), changed_out(B * T * C), att(B * NH * T * T);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, dropout(p));
    for (int t = 0; t + 1 < T; ++t) {
      CAPTURE(t);
      auto changed = qkv;  // q, k and v of every row after t replaced
      for (int b = 0; b < B; ++b) {
        const size_t from = (static_cast<size_t>(b) * T + t + 1) * 3 * C, to = (static_cast<size_t>(b) + 1) * T * 3 * C;
        std::copy(other.begin() + from, other.begin() + to, changed.begin() + from);
      }
      cpu::attention_forward(changed_out.data(), att.data(), changed.data(), B, T, C, NH, dropout(p));
      for (int b = 0; b < B; ++b) {
        const size_t row = static_cast<size_t>(b) * T * C;
        CHECK(bitwise_equal(out.data() + row, changed_out.data() + row, (t + 1) * C));
        CHECK_FALSE(bitwise_equal(out.data() + row + (t + 1) * C, changed_out.data() + row + (t + 1) * C, C));
      }
    }
  }
}

TEST_CASE("embedding_backward sums the gradients of repeated tokens", "[kernels]") {
  const int B = 3, T = 4, C = 5, V = 6;
  const std::vector<int32_t> tokens = {2, 2, 2, 2, 4, 2, 4, 2, 2, 2, 4, 4};
  const auto dout = randn(B * T * C, 1), dwte0 = randn(V * C, 2), dwpe0 = randn(T * C, 3);
  auto dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_backward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  std::vector<double> want_wte(dwte0.begin(), dwte0.end()), want_wpe(dwpe0.begin(), dwpe0.end());
  for (int r = 0; r < B * T; ++r) {
    for (int c = 0; c < C; ++c) {
      want_wte[tokens[r] * C + c] += dout[r * C + c];
      want_wpe[(r % T) * C + c] += dout[r * C + c];
    }
  }
  for (int i = 0; i < V * C; ++i) CHECK(dwte[i] == Approx(want_wte[i]).margin(1e-5));
  for (int i = 0; i < T * C; ++i) CHECK(dwpe[i] == Approx(want_wpe[i]).margin(1e-5));
  for (int v : {0, 1, 3, 5}) CHECK(bitwise_equal(dwte.data() + v * C, dwte0.data() + v * C, C));  // unused rows
}

TEST_CASE("adamw_update follows the AdamW formula with weight decay and grad_scale", "[kernels]") {
  const int n = 37;
  const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f, grad_scale = 0.5f;
  auto param = randn(n, 1);
  std::vector<float> m(n), v(n);
  std::vector<double> want_p(param.begin(), param.end()), want_m(n), want_v(n);
  for (int64_t step = 1; step <= 5; ++step) {
    CAPTURE(step);
    const auto grad = randn(n, 10 + step, 3.0f);
    cpu::adamw_update(param.data(), m.data(), v.data(), grad.data(), n, lr, beta1, beta2, eps, weight_decay, grad_scale,
                      step);
    for (int i = 0; i < n; ++i) {
      const double g = static_cast<double>(grad[i]) * grad_scale;
      want_m[i] = beta1 * want_m[i] + (1.0 - beta1) * g;
      want_v[i] = beta2 * want_v[i] + (1.0 - beta2) * g * g;
      const double m_hat = want_m[i] / (1.0 - std::pow(beta1, step));
      const double v_hat = want_v[i] / (1.0 - std::pow(beta2, step));
      want_p[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + weight_decay * want_p[i]);
      CHECK(m[i] == Approx(want_m[i]).epsilon(1e-5));
      CHECK(v[i] == Approx(want_v[i]).epsilon(1e-5));
      CHECK(param[i] == Approx(want_p[i]).epsilon(1e-6).margin(1e-7));
    }
  }
}

TEST_CASE("sum_squares matches a double loop", "[kernels]") {
  for (int n : {0, 1, 4095, 4096, 4097, 10001}) {
    CAPTURE(n);
    const auto x = randn(n, n, 3.0f);
    double want = 0.0;
    for (float xi : x) want += static_cast<double>(xi) * xi;
    CHECK(cpu::sum_squares(x.data(), n) == Approx(want).epsilon(1e-12));
  }
}

TEST_CASE("adamw_update_spans: per-span AdamW with the decay mask, and the bf16 copy in the same pass", "[kernels]") {
  const int64_t n = 64, n_lo = 96;
  // The bf16 copy at each span's lo_shift: [70, 90), [24, 54) and [0, 4) of a longer buffer (ZeRO-1/2 write into
  // their blocks of the gathered parameters).
  const std::vector<OptimSpan> spans = {
      {0, 20, 100, true, 70}, {24, 30, 500, false, 0}, {54, 0, 7, true, 5}, {60, 4, 9, true, -60}};
  const AdamWStep s{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 3};
  const auto param0 = randn(n, 1), grad = randn(n, 2);
  std::vector<float> p = param0, m(n, 0.01f), v(n, 0.02f);
  std::vector<bf16> lo(n_lo, bf16{0x1234});
  cpu::adamw_update_spans(p.data(), m.data(), v.data(), grad.data(), lo.data(), spans, s, Bf16Rounding{});
  std::vector<float> wp = param0, wm(n, 0.01f), wv(n, 0.02f);
  for (const OptimSpan& sp : spans) {
    cpu::adamw_update(wp.data() + sp.begin, wm.data() + sp.begin, wv.data() + sp.begin, grad.data() + sp.begin,
                      sp.length, s.lr, s.beta1, s.beta2, s.eps, sp.decay ? s.weight_decay : 0.0f, s.grad_scale, s.step);
  }
  REQUIRE(bitwise_equal(p, wp));  // elements outside the spans (20..23, 54..59) are untouched as well
  REQUIRE(bitwise_equal(m, wm));
  REQUIRE(bitwise_equal(v, wv));
  for (int64_t j = 0; j < n_lo; ++j) {
    const int64_t i = j >= 70 && j < 90 ? j - 70 : j >= 24 && j < 54 ? j : j < 4 ? j + 60 : -1;  // master element
    CAPTURE(j);
    REQUIRE(lo[j].bits == (i >= 0 ? f32_to_bf16(p[i]).bits : 0x1234));
  }
  // round_to_bf16_spans writes the same places.
  std::vector<bf16> lo2(n_lo, bf16{0x1234});
  CpuBackend().round_to_bf16_spans(lo2.data(), p.data(), spans, Bf16Rounding{});
  REQUIRE(std::memcmp(lo2.data(), lo.data(), lo.size() * sizeof(bf16)) == 0);
  // sum_squares_spans adds the spans' sums in order.
  double want = 0.0;
  for (const OptimSpan& sp : spans) want += cpu::sum_squares(grad.data() + sp.begin, sp.length);
  REQUIRE(cpu::sum_squares_spans(grad.data(), spans) == want);
}

TEST_CASE("stochastic bf16 rounding is unbiased and a function of each weight's model index", "[kernels]") {
  Bf16Rounding r;
  r.stochastic = true;
  r.rng = CounterRng(11, 12);
  // 1 + 0.3 ulp(bf16): rounds to 1 or to 1 + 2^-7, up with probability 0.3.
  const float x = 1.0f + 0.3f * 0.0078125f;
  const int64_t n = 20000;
  std::vector<float> src(n, x);
  std::vector<bf16> dst(n);
  cpu::round_to_bf16(dst.data(), src.data(), n, 777, r);
  double mean = 0.0;
  int64_t up = 0;
  for (const bf16 b : dst) {
    const float f = bf16_to_f32(b);
    REQUIRE((f == 1.0f || f == 1.0078125f));
    up += f > 1.0f;
    mean += f;
  }
  mean /= n;
  // Binomial(20000, 0.3): sd of the fraction = 0.0032; 5 sd.
  CHECK(std::abs(static_cast<double>(up) / n - 0.3) < 0.016);
  CHECK(std::abs(mean - x) < 0.016 * 0.0078125);
  // Element i's rounding depends only on its model index: the same elements rounded from another start agree.
  std::vector<bf16> part(100);
  cpu::round_to_bf16(part.data(), src.data() + 500, 100, 777 + 500, r);
  REQUIRE(std::memcmp(part.data(), dst.data() + 500, 100 * sizeof(bf16)) == 0);
  // Exact bf16 values, infinities and NaN are kept; nearest rounding is f32_to_bf16.
  const float specials[] = {1.0f, -2.5f, 0.0f, std::numeric_limits<float>::infinity(), kNaN};
  for (const float f : specials) {
    bf16 b{};
    cpu::round_to_bf16(&b, &f, 1, 3, r);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(bf16_to_f32(b)));
    } else {
      REQUIRE(bf16_to_f32(b) == f);
    }
  }
  cpu::round_to_bf16(dst.data(), src.data(), n, 777, Bf16Rounding{});
  for (const bf16 b : dst) REQUIRE(b.bits == f32_to_bf16(x).bits);
}

TEST_CASE("residual_layernorm_forward equals residual_forward then layernorm_forward bit for bit", "[kernels]") {
  for (const auto& [N, C, p] :
       {std::tuple<int64_t, int, float>{1, 3, 0.0f}, {17, 48, 0.0f}, {17, 48, 0.3f}, {9, 131, 0.1f}}) {
    CAPTURE(N, C, p);
    const DropoutMask drop = p > 0.0f ? dropout(p) : DropoutMask{};
    const auto res = randn(N * C, 1, 2.0f), add = randn(N * C, 2), w = randn(C, 3), b = randn(C, 4);
    std::vector<float> s_res(N * C), s_out(N * C), s_mean(N), s_rstd(N);
    cpu::residual_forward(s_res.data(), res.data(), add.data(), N * C, drop);
    cpu::layernorm_forward(s_out.data(), s_mean.data(), s_rstd.data(), s_res.data(), w.data(), b.data(), N, C);
    std::vector<float> f_res(N * C, kNaN), f_out(N * C, kNaN), f_mean(N, kNaN), f_rstd(N, kNaN);
    cpu::residual_layernorm_forward(f_res.data(), f_out.data(), f_mean.data(), f_rstd.data(), res.data(), add.data(),
                                    w.data(), b.data(), N, C, drop);
    REQUIRE(bitwise_equal(f_res, s_res));
    REQUIRE(bitwise_equal(f_out, s_out));
    REQUIRE(bitwise_equal(f_mean, s_mean));
    REQUIRE(bitwise_equal(f_rstd, s_rstd));
    // In place (res_out aliases res), and without statistics (recomputation's form).
    std::vector<float> i_res = res, i_out(N * C, kNaN);
    cpu::residual_layernorm_forward(i_res.data(), i_out.data(), nullptr, nullptr, i_res.data(), add.data(), w.data(),
                                    b.data(), N, C, drop);
    REQUIRE(bitwise_equal(i_res, s_res));
    REQUIRE(bitwise_equal(i_out, s_out));
    if (p > 0.0f) {  // the mask really dropped something
      std::vector<float> plain(N * C);
      cpu::residual_forward(plain.data(), res.data(), add.data(), N * C, DropoutMask{});
      REQUIRE_FALSE(bitwise_equal(plain, s_res));
    }
  }
}

}  // namespace
}  // namespace gpt
