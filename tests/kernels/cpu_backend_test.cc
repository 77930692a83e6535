// CpuBackend's mixed-precision contract (backend.h): bf16 outputs are the fp32 outputs rounded to nearest even,
// bit for bit, and under bf16 compute a GEMM multiplies its inputs rounded to bf16 (a bf16 input as it is) in
// fp32, with dbias summed from the fp32 output gradient. The model's bf16 path on the CPU rests on these.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "kernels/kernel_test_util.h"

namespace gpt {
namespace {

using testing::randn;

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = f32_to_bf16(x[i]);
  return r;
}
std::vector<float> rounded(const std::vector<float>& x) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = bf16_to_f32(f32_to_bf16(x[i]));
  return r;
}
bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Backend> cpu() {
  auto be = std::move(*make_backend("cpu"));
  be->set_threads(2);
  return be;
}

TEST_CASE("CpuBackend: bf16 outputs of layernorm, residual + layernorm, gelu and dlogits are the fp32 ones rounded",
          "[kernels]") {
  auto be = cpu();
  const int N = 5, C = 12;  // rows of 24 bytes in bf16
  const auto x = randn(N * C, 1), w = randn(C, 2), b = randn(C, 3), add = randn(N * C, 4);
  const DropoutMask drop{0.2f, CounterRng(3, 4), 17};
  for (const DType compute : {DType::kF32, DType::kBF16}) {  // storage only: the same under either compute dtype
    CAPTURE(dtype_name(compute));
    be->set_compute_dtype(compute);
    std::vector<float> y(N * C), mean(N), rstd(N), mean_lo(N), rstd_lo(N);
    std::vector<bf16> y_lo(N * C);
    be->layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    be->layernorm_forward(y_lo.data(), mean_lo.data(), rstd_lo.data(), x.data(), w.data(), b.data(), N, C);
    CHECK(same_bits(y_lo, to_bf16(y)));
    CHECK(same_bits(mean_lo, mean));
    CHECK(same_bits(rstd_lo, rstd));

    std::vector<float> res(N * C), res_lo(N * C);
    be->residual_layernorm_forward(res.data(), y.data(), mean.data(), rstd.data(), x.data(), add.data(), w.data(),
                                   b.data(), N, C, drop);
    be->residual_layernorm_forward(res_lo.data(), y_lo.data(), mean_lo.data(), rstd_lo.data(), x.data(), add.data(),
                                   w.data(), b.data(), N, C, drop);
    CHECK(same_bits(res_lo, res));
    CHECK(same_bits(y_lo, to_bf16(y)));
    CHECK(same_bits(mean_lo, mean));

    std::vector<float> g(N * C);
    std::vector<bf16> g_lo(N * C);
    be->gelu_forward(g.data(), x.data(), N * C);
    be->gelu_forward(g_lo.data(), x.data(), N * C);
    CHECK(same_bits(g_lo, to_bf16(g)));

    const int V = 10, Vp = 12;  // rows of C = 12 logits, the last 2 padding
    const std::vector<int32_t> targets = {0, 3, 9, 5, 1};
    std::vector<float> loss(N), loss_lo(N), dlogits(N * Vp);
    std::vector<bf16> dlogits_lo(N * Vp);
    be->crossentropy_forward_backward(loss.data(), dlogits.data(), x.data(), targets.data(), N, V, Vp, 0.1f);
    be->crossentropy_forward_backward(loss_lo.data(), dlogits_lo.data(), x.data(), targets.data(), N, V, Vp, 0.1f);
    CHECK(same_bits(loss_lo, loss));
    CHECK(same_bits(dlogits_lo, to_bf16(dlogits)));
  }
}

TEST_CASE("CpuBackend bf16 compute: GEMMs multiply bf16-rounded inputs in fp32, bf16 inputs are taken as they are",
          "[kernels]") {
  auto be = cpu();
  const int N = 6, C = 12, OC = 10;
  const auto inp = randn(N * C, 1), weight = randn(OC * C, 2), bias = randn(OC, 3), dout = randn(N * OC, 4);
  const std::vector<bf16> inp_lo = to_bf16(inp);

  // The reference: fp32 compute on the rounded operands (dbias from the rounded dout too: the GEMMs' view of it).
  be->set_compute_dtype(DType::kF32);
  std::vector<float> want(N * OC), want_dinp(N * C), want_dw(OC * C, 0.5f), want_db(OC, 0.25f), unused_db(OC);
  be->matmul_forward(want.data(), rounded(inp).data(), rounded(weight).data(), bias.data(), N, C, OC);
  be->matmul_backward(want_dinp.data(), want_dw.data(), unused_db.data(), rounded(dout).data(), rounded(inp).data(),
                      rounded(weight).data(), N, C, OC);
  std::vector<float> no_dw(OC * C);
  be->matmul_backward(nullptr, no_dw.data(), want_db.data(), rounded(dout).data(), inp.data(), weight.data(), N, C, OC);

  be->set_compute_dtype(DType::kBF16);
  const std::vector<bf16> weight_lo = to_bf16(weight), dout_lo = to_bf16(dout);
  for (const bool lo : {false, true}) {
    CAPTURE(lo);
    // bf16 operands as they are, or fp32 ones the backend rounds: the same products.
    const ConstTensorPtr x = lo ? ConstTensorPtr(inp_lo.data()) : ConstTensorPtr(inp.data());
    const ConstTensorPtr wt = lo ? ConstTensorPtr(weight_lo.data()) : ConstTensorPtr(weight.data());
    std::vector<float> out(N * OC), dinp(N * C), dw(OC * C, 0.5f), db(OC, 0.25f);
    be->matmul_forward(out.data(), x, wt, bias.data(), N, C, OC);
    be->matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), x, wt, N, C, OC);
    CHECK(same_bits(out, want));
    CHECK(same_bits(dinp, want_dinp));
    CHECK(same_bits(dw, want_dw));  // accumulated into (+=), as under fp32
    CHECK(same_bits(db, want_db));
    // A bf16 output gradient (dqkv, the GELU's, the LM head's dlogits): the same, dbias included.
    std::vector<float> dinp2(N * C), dw2(OC * C, 0.5f), db2(OC, 0.25f);
    be->matmul_backward(dinp2.data(), dw2.data(), db2.data(), dout_lo.data(), x, wt, N, C, OC);
    CHECK(same_bits(dinp2, want_dinp));
    CHECK(same_bits(dw2, want_dw));
    CHECK(same_bits(db2, want_db));
  }
  // The rounding is real: fp32 compute on the unrounded inputs differs.
  be->set_compute_dtype(DType::kF32);
  std::vector<float> exact(N * OC);
  be->matmul_forward(exact.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  CHECK_FALSE(same_bits(exact, want));
}

// Parameters held in bf16 (ShardedParams under bf16 compute) are read widened: LayerNorm (plain, fused, backward),
// a GEMM's bias (fp32 and bf16 outputs, either compute dtype) and the embedding tables give the results of their fp32
// values, bit for bit.
TEST_CASE("CpuBackend: bf16 parameters give the results of their fp32 values", "[kernels]") {
  auto be = cpu();
  const int N = 6, C = 12, OC = 8, V = 9;
  const auto x = randn(N * C, 11), add = randn(N * C, 12), dout = randn(N * C, 13), inp = randn(N * C, 14);
  const auto w = rounded(randn(C, 15)), b = rounded(randn(C, 16)), gw = rounded(randn(OC * C, 17));
  const auto gb = rounded(randn(OC, 18)), wte = rounded(randn(V * C, 19)), wpe = rounded(randn(N * C, 20));
  const auto w_lo = to_bf16(w), b_lo = to_bf16(b), gb_lo = to_bf16(gb), wte_lo = to_bf16(wte), wpe_lo = to_bf16(wpe);
  const DropoutMask drop{0.2f, CounterRng(5, 6), 3};
  for (const DType compute : {DType::kF32, DType::kBF16}) {
    CAPTURE(dtype_name(compute));
    be->set_compute_dtype(compute);
    std::vector<float> y[2], mean[2], rstd[2], res[2], dx[2], dw[2], db[2], g[2], e[2];
    std::vector<bf16> y_lo[2], g_lo[2];
    for (int k = 0; k < 2; ++k) {
      const ConstTensorPtr lw = k == 0 ? ConstTensorPtr(w.data()) : ConstTensorPtr(w_lo.data());
      const ConstTensorPtr lb = k == 0 ? ConstTensorPtr(b.data()) : ConstTensorPtr(b_lo.data());
      const ConstTensorPtr bias = k == 0 ? ConstTensorPtr(gb.data()) : ConstTensorPtr(gb_lo.data());
      y[k].resize(N * C), mean[k].resize(N), rstd[k].resize(N), res[k].resize(N * C), y_lo[k].resize(N * C);
      be->layernorm_forward(y[k].data(), mean[k].data(), rstd[k].data(), x.data(), lw, lb, N, C);
      be->residual_layernorm_forward(res[k].data(), y_lo[k].data(), nullptr, nullptr, x.data(), add.data(), lw, lb, N,
                                     C, drop);
      dx[k] = add, dw[k].assign(C, 0.5f), db[k].assign(C, -0.5f);
      be->layernorm_backward(dx[k].data(), dw[k].data(), db[k].data(), dout.data(), x.data(), lw, mean[k].data(),
                             rstd[k].data(), N, C, nullptr);
      g[k].resize(N * OC);
      be->matmul_forward(g[k].data(), inp.data(), gw.data(), bias, N, C, OC);
      if (compute == DType::kBF16) {
        g_lo[k].resize(N * OC);
        be->matmul_forward(g_lo[k].data(), inp.data(), gw.data(), bias, N, C, OC);
      }
      e[k].resize(N * C);
      const std::vector<int32_t> tokens = {0, 3, 8, 3, 1, 5};
      if (k == 0) {
        be->embedding_forward(e[k].data(), tokens.data(), wte.data(), wpe.data(), 1, N, C);
      } else {
        be->embedding_forward(e[k].data(), tokens.data(), wte_lo.data(), wpe_lo.data(), 1, N, C);
      }
    }
    CHECK(same_bits(y[1], y[0]));
    CHECK(same_bits(mean[1], mean[0]));
    CHECK(same_bits(res[1], res[0]));
    CHECK(same_bits(y_lo[1], y_lo[0]));
    CHECK(same_bits(dx[1], dx[0]));
    CHECK(same_bits(dw[1], dw[0]));
    CHECK(same_bits(db[1], db[0]));
    CHECK(same_bits(g[1], g[0]));
    CHECK(same_bits(g_lo[1], g_lo[0]));
    CHECK(same_bits(e[1], e[0]));
    CHECK(e[0][C] == wte[3 * C] + wpe[C]);  // row 1: token 3 at position 1
  }
}

}  // namespace
}  // namespace gpt
