// Per-kernel gradient checks for kernels/cpu: for each op family, L = sum(w * f(x)) with random w, and the
// backward's gradient w.r.t. every input and parameter is compared with central finite differences in
// every element. Dropout variants fix the mask through DropoutMask, so f stays deterministic.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/kernels.h"
#include "kernels/kernel_test_util.h"

namespace gpt {
namespace {

using testing::check_gradient;
using testing::rand_tokens;
using testing::randn;
using testing::weighted_sum;

const DropoutMask kNoDropout{};
DropoutMask dropout(float p) { return DropoutMask{p, CounterRng(7, 3), 11}; }

TEST_CASE("embedding gradients match finite differences", "[kernels]") {
  const int B = 2, T = 4, C = 3, V = 5;
  const std::vector<int32_t> tokens = {1, 3, 1, 1, 0, 3, 2, 1};  // repeats; token 4 unused
  auto wte = randn(V * C, 1), wpe = randn(T * C, 2);
  const auto w = randn(B * T * C, 3);
  std::vector<float> out(B * T * C);
  auto loss = [&] {
    cpu::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return weighted_sum(w, out);
  };
  std::vector<float> dwte(wte.size()), dwpe(wpe.size());
  cpu::embedding_backward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C);
  check_gradient("dwte", wte, dwte, loss);
  check_gradient("dwpe", wpe, dwpe, loss);
}

TEST_CASE("matmul gradients match finite differences, with and without bias", "[kernels]") {
  const int N = 5, C = 6, OC = 4;
  auto inp = randn(N * C, 1), weight = randn(OC * C, 2), bias = randn(OC, 3);
  const auto w = randn(N * OC, 4);
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    std::vector<float> out(N * OC);
    auto loss = [&] {
      cpu::matmul_forward(out.data(), inp.data(), weight.data(), with_bias ? bias.data() : nullptr, N, C, OC);
      return weighted_sum(w, out);
    };
    std::vector<float> dinp(inp.size()), dweight(weight.size()), dbias(bias.size());
    cpu::matmul_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, w.data(), inp.data(),
                         weight.data(), N, C, OC);
    check_gradient("dinp", inp, dinp, loss);
    check_gradient("dweight", weight, dweight, loss);
    if (with_bias) check_gradient("dbias", bias, dbias, loss);
  }
}

TEST_CASE("layernorm gradients match finite differences", "[kernels]") {
  const int N = 6, C = 8;
  auto inp = randn(N * C, 1, 2.0f), weight = randn(C, 2), bias = randn(C, 3);
  const auto w = randn(N * C, 4);
  std::vector<float> out(N * C), mean(N), rstd(N);
  auto loss = [&] {
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return weighted_sum(w, out);
  };
  loss();  // saves mean and rstd for backward
  std::vector<float> dinp(inp.size()), dweight(C), dbias(C);
  cpu::layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), mean.data(),
                          rstd.data(), N, C);
  check_gradient("dinp", inp, dinp, loss);
  check_gradient("dweight", weight, dweight, loss);
  check_gradient("dbias", bias, dbias, loss);
}

TEST_CASE("causal attention gradients match finite differences, with and without dropout", "[kernels]") {
  const int B = 2, T = 5, C = 8, NH = 2;
  for (float p : {0.0f, 0.2f}) {
    CAPTURE(p);
    const DropoutMask drop = dropout(p);
    auto qkv = randn(B * T * 3 * C, 1);
    const auto w = randn(B * T * C, 2);
    std::vector<float> out(B * T * C), att(B * NH * T * T);
    auto loss = [&] {
      cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH, drop);
      return weighted_sum(w, out);
    };
    loss();  // saves att for backward
    std::vector<float> dqkv(qkv.size());
    cpu::attention_backward(dqkv.data(), w.data(), qkv.data(), att.data(), B, T, C, NH, drop);
    check_gradient("dqkv", qkv, dqkv, loss);
  }
}

// The KV-cache attention (sampling) is the causal attention's rows from t0 on, computed from those rows' queries and
// every key up to them. The cache's rows past the sequence (not written yet, as in the sampler's cache of block_size
// rows) are NaN here, so reading past T shows; the masking inside [0, T) is what the comparison with the whole
// sequence's attention checks.
TEST_CASE("attention over a KV cache gives the causal attention's last rows", "[kernels]") {
  const int T = 19, C = 24, NH = 3;
  const auto qkv = randn(static_cast<size_t>(T) * 3 * C, 31, 2.0f);
  std::vector<float> full(static_cast<size_t>(T) * C), att(static_cast<size_t>(NH) * T * T);
  cpu::attention_forward(full.data(), att.data(), qkv.data(), 1, T, C, NH, DropoutMask{});
  for (const int len : {1, 7, 19}) {
    for (const int t0 : {0, len / 2, len - 1}) {
      CAPTURE(len, t0);
      std::vector<float> cache(qkv.begin(), qkv.begin() + static_cast<int64_t>(len) * 3 * C);
      cache.resize(static_cast<size_t>(T) * 3 * C, NAN);  // positions past len: not part of the sequence yet
      std::vector<float> want(static_cast<size_t>(len) * C), a(static_cast<size_t>(NH) * len * len);
      cpu::attention_forward(want.data(), a.data(), cache.data(), 1, len, C, NH, DropoutMask{});
      std::vector<float> rows(static_cast<size_t>(len - t0) * C, NAN);
      cpu::attention_forward_rows(rows.data(), cache.data(), len, t0, C, NH);
      for (int i = 0; i < (len - t0) * C; ++i) {
        REQUIRE(rows[i] == Approx(want[t0 * C + i]).margin(1e-6));
        REQUIRE(rows[i] == Approx(full[t0 * C + i]).margin(1e-6));  // causal: later positions change nothing
      }
    }
  }
}

TEST_CASE("gelu gradient matches finite differences", "[kernels]") {
  const int N = 64;
  auto inp = randn(N, 1, 2.0f);
  const auto w = randn(N, 2);
  std::vector<float> out(N);
  auto loss = [&] {
    cpu::gelu_forward(out.data(), inp.data(), N);
    return weighted_sum(w, out);
  };
  std::vector<float> dinp(N);
  cpu::gelu_backward(dinp.data(), inp.data(), w.data(), N);
  check_gradient("dinp", inp, dinp, loss);
}

// residual_forward has no backward of its own: the model uses identity for res and dropout_backward for inp.
TEST_CASE("residual with dropout: gradients are identity and dropout_backward", "[kernels]") {
  const int N = 40;
  for (float p : {0.0f, 0.2f}) {
    CAPTURE(p);
    const DropoutMask drop = dropout(p);
    auto res = randn(N, 1), inp = randn(N, 2);
    const auto w = randn(N, 3);
    std::vector<float> out(N);
    auto loss = [&] {
      cpu::residual_forward(out.data(), res.data(), inp.data(), N, drop);
      return weighted_sum(w, out);
    };
    std::vector<float> dinp(N);
    cpu::dropout_backward(dinp.data(), w.data(), N, drop);
    check_gradient("dres", res, w, loss);
    check_gradient("dinp", inp, dinp, loss);
  }
}

TEST_CASE("dropout_backward is the gradient of dropout_forward", "[kernels]") {
  const int N = 40;
  for (float p : {0.0f, 0.2f}) {
    CAPTURE(p);
    const DropoutMask drop = dropout(p);
    auto x = randn(N, 1);
    const auto w = randn(N, 2);
    auto loss = [&] {
      std::vector<float> y = x;
      cpu::dropout_forward(y.data(), N, drop);
      return weighted_sum(w, y);
    };
    std::vector<float> dx(N);
    cpu::dropout_backward(dx.data(), w.data(), N, drop);
    check_gradient("dx", x, dx, loss);
    if (p > 0) {
      int dropped = 0;
      for (float g : dx) dropped += g == 0.0f;
      CHECK(dropped > 0);
      CHECK(dropped < N);
    }
  }
}

TEST_CASE("crossentropy gradient matches finite differences, padded columns get zero", "[kernels]") {
  const int N = 4, V = 5, Vp = 8;
  const float dloss = 0.37f;
  auto logits = randn(N * Vp, 1, 2.0f);
  const auto targets = rand_tokens(N, V, 2);
  std::vector<float> losses(N);
  auto loss = [&] {
    cpu::crossentropy_forward_backward(losses.data(), nullptr, logits.data(), targets.data(), N, V, Vp, dloss);
    double s = 0.0;
    for (float l : losses) s += dloss * static_cast<double>(l);
    return s;
  };
  std::vector<float> dlogits(N * Vp, 7.0f);  // padding must be overwritten, not left
  cpu::crossentropy_forward_backward(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp, dloss);
  for (int i = 0; i < N; ++i) {
    double lse = 0.0;
    for (int j = 0; j < V; ++j) lse += std::exp(static_cast<double>(logits[i * Vp + j]));
    CHECK(losses[i] == Approx(std::log(lse) - logits[i * Vp + targets[i]]).epsilon(1e-5));
    for (int j = V; j < Vp; ++j) CHECK(dlogits[i * Vp + j] == 0.0f);
  }
  check_gradient("dlogits", logits, dlogits, loss);
}

}  // namespace
}  // namespace gpt
