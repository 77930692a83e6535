// adamw (+ sum_squares, the multi-tensor kernels) and matmul (dbias kernels; the GEMMs go through the emulated
// cuBLASLt) run in the CPU emulator of the CUDA model, against their CPU twins in kernels/cpu; test_kernels.cc
// has the other kernel families. Outputs start NaN-poisoned and every kernel runs twice: the same bits.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <vector>

#include "core/dtype.h"
#include "emu_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace {

using namespace gpt::emu_test;
using gpt::CounterRng;
using gpt::DropoutMask;
namespace emu = gpt::cuda_emu;
namespace cpu = gpt::cpu;

void run_adamw(int64_t n, bool sum_squares) {
  INFO("adamw n=" << n << " grid cap=" << emu_grid_cap);
  Buf<float> p(n), m(n), v(n), g(n), cp(n), cm(n), cv(n);
  randn(p), randn(g, 0.1f);
  m.fill(0), v.fill(0);
  cp.copy_from(p), cm.copy_from(m), cv.copy_from(v);
  for (int step = 1; step <= 3; ++step) {
    cpu::adamw_update(cp.p, cm.p, cv.p, g.p, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.8f, step);
    emu::adamw_update(p.p, m.p, v.p, g.p, n, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.8f, step, nullptr);
    for (int64_t i = 0; i < n; ++i) g[i] = g[i] * 0.7f + 0.01f;
  }
  const Cmp ep = compare(p.p, cp.p, n), em = compare(m.p, cm.p, n), ev = compare(v.p, cv.p, n);
  CHECK(ep.nonfinite + em.nonfinite + ev.nonfinite == 0);
  CHECK(ep.rel() < 1e-6);
  CHECK(em.rel() < 1e-6);
  CHECK(ev.rel() < 1e-6);
  if (!sum_squares) return;
  Buf<double> res[2] = {Buf<double>(1), Buf<double>(1)};
  for (int r = 0; r < 2; ++r) {
    Buf<unsigned char> scratch(emu::sum_squares_scratch_bytes());
    scratch.fill(0xFF);
    emu::sum_squares(res[r].p, g.p, n, scratch.p, nullptr);
  }
  CHECK(res[0].same(res[1]));
  const double cs = cpu::sum_squares(g.p, n);
  CHECK(std::abs(res[0][0] - cs) <= 1e-6 * std::abs(cs));
}

// The multi-tensor AdamW (one launch over several spans, gaps between them untouched), its bf16 copy (nearest
// and stochastic: the bits of each element's model index) and the spans' sum of squares, against the CPU.
void run_adamw_spans(bool stochastic) {
  INFO("adamw spans stochastic=" << stochastic);
  using gpt::AdamWStep;
  using gpt::Bf16Rounding;
  using gpt::OptimSpan;
  const int64_t n = 9400, n_lo = n + 16;
  // A span over two tiles, an empty one, one that does not start on a tile boundary, a 1-element one. The first
  // and the last have their bf16 copies elsewhere (lo_shift: [n, n + 10) and 12), as ZeRO-1/2's do.
  const std::vector<OptimSpan> spans = {{0, 10, 1000, true, n},
                                        {10, 0, 5, false},
                                        {16, 5000, 20000, false},
                                        {5100, 4000, 7, true},
                                        {9399, 1, 3, false, 12 - 9399}};
  Buf<float> p(n), m(n), v(n), g(n), cp(n), cm(n), cv(n);
  randn(p), randn(g, 0.1f);
  m.fill(0), v.fill(0);
  cp.copy_from(p), cm.copy_from(m), cv.copy_from(v);
  Buf<gpt::bf16> lo(n_lo), clo(n_lo);
  lo.fill(gpt::bf16{0x1234}), clo.fill(gpt::bf16{0x1234});
  Bf16Rounding r;
  r.stochastic = stochastic;
  r.rng = CounterRng(5, 6);
  Buf<unsigned char> table_mem(emu::span_table_bytes(spans));
  table_mem.fill(0xFF);
  const emu::SpanTable table = emu::write_span_table(spans, table_mem.p, nullptr);
  CHECK(table.count == 4);              // the empty span owns no tile
  CHECK(table.tiles == 1 + 2 + 1 + 1);  // ceil(length / 4096) each
  for (int step = 1; step <= 3; ++step) {
    const AdamWStep s{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.8f, step};
    gpt::cpu::adamw_update_spans(cp.p, cm.p, cv.p, g.p, clo.p, spans, s, r);
    emu::adamw_update_spans(p.p, m.p, v.p, g.p, lo.p, table, s, r, nullptr);
  }
  const Cmp ep = compare(p.p, cp.p, n), em = compare(m.p, cm.p, n), ev = compare(v.p, cv.p, n);
  CHECK(ep.nonfinite + em.nonfinite + ev.nonfinite == 0);
  CHECK(ep.rel() < 1e-6);
  CHECK(em.rel() < 1e-6);
  CHECK(ev.rel() < 1e-6);
  // Gaps (10..15, 5016..5099) untouched; the bf16 copy (at i + lo_shift) is the rounding of the kernel's own master
  // weights, and nothing else of the bf16 buffer is written.
  std::vector<bool> in_span(n, false), lo_written(n_lo, false);
  for (const OptimSpan& sp : spans) {
    for (int64_t i = 0; i < sp.length; ++i) {
      in_span[sp.begin + i] = true;
      const int64_t at = sp.begin + i + sp.lo_shift;
      lo_written[at] = true;
      const uint32_t u = std::bit_cast<uint32_t>(p[sp.begin + i]);
      const uint16_t want =
          stochastic ? gpt::bf16_bits_stochastic(u, r.rng.u32(sp.index + i)) : gpt::f32_to_bf16(p[sp.begin + i]).bits;
      if (lo[at].bits != want) FAIL_CHECK("bf16 copy wrong at " << at);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (in_span[i]) continue;
    if (m[i] != 0.0f || std::isnan(p[i])) FAIL_CHECK("gap element written at " << i);
  }
  for (int64_t i = 0; i < n_lo; ++i) {
    if (!lo_written[i] && lo[i].bits != 0x1234) FAIL_CHECK("bf16 element outside the spans' copies written at " << i);
  }
  // The same rounding on its own (publish after a restore).
  Buf<gpt::bf16> lo2(n_lo);
  lo2.fill(gpt::bf16{0x1234});
  emu::round_to_bf16_spans(lo2.p, p.p, table, r, nullptr);
  CHECK(lo2.same(lo));
  // Sum of squares over the spans: deterministic, and the CPU's within double rounding.
  Buf<double> res[2] = {Buf<double>(1), Buf<double>(1)};
  Buf<unsigned char> scratch(emu::sum_squares_spans_scratch_bytes(table));
  for (int k = 0; k < 2; ++k) {
    scratch.fill(0xFF);
    emu::sum_squares_spans(res[k].p, g.p, table, scratch.p, nullptr);
  }
  CHECK(res[0].same(res[1]));
  const double cs = gpt::cpu::sum_squares_spans(g.p, spans);
  CHECK(std::abs(res[0][0] - cs) <= 1e-12 * std::abs(cs));
}

// Matmul: the GEMMs through the emulated cuBLASLt (transposes, leading dimensions, bias epilogue or kernel)
// and the dbias kernels, against kernels/cpu/matmul.cc. bias_off/other offsets misalign the operands. out's and
// dout's rows are ld >= OC elements apart (the LM head's padded logits); their padding is NaN, which the forward
// must leave so (it writes no column past OC) and the backward must not read (the results would not be finite).
void run_matmul(int64_t N, int C, int OC, size_t off, bool bf16_inputs, int64_t ld = 0) {
  if (ld == 0) ld = OC;
  INFO("matmul N=" << N << " C=" << C << " OC=" << OC << " ld=" << ld << " offset=" << off << " bf16=" << bf16_inputs);
  // The N x OC values of rows ld apart, contiguous; and whether every padding element is still NaN.
  auto real = [&](const float* x) {
    std::vector<float> r(static_cast<size_t>(N * OC));
    for (int64_t i = 0; i < N; ++i) std::copy(x + i * ld, x + i * ld + OC, r.begin() + i * OC);
    return r;
  };
  auto padding_untouched = [&](const auto* x) {
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = OC; j < ld; ++j) {
        float v;
        if constexpr (std::is_same_v<std::remove_cv_t<std::remove_pointer_t<decltype(x)>>, gpt::bf16>) {
          v = gpt::bf16_to_f32(x[i * ld + j]);
        } else {
          v = x[i * ld + j];
        }
        if (!std::isnan(v)) return false;
      }
    }
    return true;
  };
  Buf<float> inp(N * C, off), w(static_cast<size_t>(OC) * C, off), bias(OC, off), dout(N * ld, off);
  randn(inp), randn(w), randn(bias), randn(dout);
  for (int64_t i = 0; i < N; ++i) std::fill(dout.p + i * ld + OC, dout.p + (i + 1) * ld, NAN);
  // With bf16 inputs the CPU twin gets the bf16-rounded values (the products are the same; only the order of
  // the fp32 sums differs).
  Buf<gpt::bf16> inp_h(inp.n, off), w_h(w.n, off), dout_h(dout.n, off);
  if (bf16_inputs) {
    for (size_t i = 0; i < inp.n; ++i) inp_h[i] = gpt::f32_to_bf16(inp[i]), inp[i] = gpt::bf16_to_f32(inp_h[i]);
    for (size_t i = 0; i < w.n; ++i) w_h[i] = gpt::f32_to_bf16(w[i]), w[i] = gpt::bf16_to_f32(w_h[i]);
    for (size_t i = 0; i < dout.n; ++i) dout_h[i] = gpt::f32_to_bf16(dout[i]);
  }
  Buf<float> dout_r(dout.n);  // what the GEMMs see of dout
  for (size_t i = 0; i < dout.n; ++i) dout_r[i] = bf16_inputs ? gpt::bf16_to_f32(dout_h[i]) : dout[i];
  const gpt::DType type = bf16_inputs ? gpt::DType::kBF16 : gpt::DType::kF32;
  const void* inp_in = bf16_inputs ? static_cast<const void*>(inp_h.p) : inp.p;
  const void* w_in = bf16_inputs ? static_cast<const void*>(w_h.p) : w.p;
  const void* dout_in = bf16_inputs ? static_cast<const void*>(dout_h.p) : dout.p;

  Buf<unsigned char> cublas_ws(gpt::cuda_workspace::kCublasLtBytes);
  emu::Matmul mm(nullptr, cublas_ws.p);
  Buf<float> out(N * ld, off), cout(N * ld);
  mm.forward(out.p, gpt::DType::kF32, inp_in, w_in, type, bias.p, N, C, OC, ld);
  cpu::matmul_forward(cout.p, inp.p, w.p, bias.p, N, C, OC, ld);
  CHECK(padding_untouched(out.p));
  CHECK(padding_untouched(cout.p));
  const Cmp eo = compare(real(out.p).data(), real(cout.p).data(), N * OC);
  CHECK(eo.nonfinite == 0);
  CHECK(eo.rel() < 1e-5);
  // The same shape again with another bias (the cached plan must take the new bias pointer).
  Buf<float> bias2(OC, off), out2(N * ld, off), cout2(N * ld);
  for (int j = 0; j < OC; ++j) bias2[j] = bias[j] + 1.0f;
  mm.forward(out2.p, gpt::DType::kF32, inp_in, w_in, type, bias2.p, N, C, OC, ld);
  cpu::matmul_forward(cout2.p, inp.p, w.p, bias2.p, N, C, OC, ld);
  CHECK(compare(real(out2.p).data(), real(cout2.p).data(), N * OC).rel() < 1e-5);
  // And with a bias 16 bytes past bias2's alignment: cuBLASLt's heuristic takes the bias's alignment from the
  // pointer it was given, so a plan made for a 256-byte aligned bias is not one for this bias.
  Buf<float> bias3(OC, off + 4), out3(N * ld, off);
  bias3.copy_from(bias2);
  mm.forward(out3.p, gpt::DType::kF32, inp_in, w_in, type, bias3.p, N, C, OC, ld);
  CHECK(compare(real(out3.p).data(), real(cout2.p).data(), N * OC).rel() < 1e-5);
  if (bf16_inputs) {
    // A bf16 output (the fc GEMM's under bf16 compute) with a bf16 bias (aligned: the backend's bias area) and
    // without: the fp32 sum, bias included, rounded once. The CPU twin's fp32 result with the bf16 bias, rounded,
    // may differ in the last bf16 place where the two sums round to either side of a tie.
    Buf<gpt::bf16> bias_h(OC), out_h(N * ld, off);
    Buf<float> bias_r(OC), cout_h(N * ld);
    for (int j = 0; j < OC; ++j) bias_h[j] = gpt::f32_to_bf16(bias[j]), bias_r[j] = gpt::bf16_to_f32(bias_h[j]);
    for (const bool with_bias : {true, false}) {
      CAPTURE(with_bias);
      out_h.fill(gpt::f32_to_bf16(NAN));
      mm.forward(out_h.p, gpt::DType::kBF16, inp_in, w_in, type, with_bias ? bias_h.p : nullptr, N, C, OC, ld);
      cpu::matmul_forward(cout_h.p, inp.p, w.p, with_bias ? bias_r.p : nullptr, N, C, OC, ld);
      CHECK(padding_untouched(out_h.p));
      double worst = 0.0;
      for (int64_t i = 0; i < N; ++i) {
        for (int64_t j = 0; j < OC; ++j) {
          const double got = gpt::bf16_to_f32(out_h[i * ld + j]);
          const double want = gpt::bf16_to_f32(gpt::f32_to_bf16(cout_h[i * ld + j]));
          worst = std::max(worst, std::abs(got - want) / std::max(std::abs(want), 1e-3));
        }
      }
      CHECK(worst <= 1.0 / 128);  // one bf16 place (2^-8 relative) at most
    }
  }

  Buf<float> dw0(w.n), db0(OC);
  randn(dw0), randn(db0);
  Buf<float> cdinp(inp.n), cdw(w.n), cdb(OC), cdb_only(OC);
  cdw.copy_from(dw0), cdb.copy_from(db0), cdb_only.copy_from(db0);
  cpu::matmul_backward(cdinp.p, cdw.p, nullptr, dout_r.p, inp.p, w.p, N, C, OC, ld);
  Buf<float> dummy(inp.n), dummy_w(w.n);
  dummy_w.fill(0.0f);
  cpu::matmul_backward(dummy.p, dummy_w.p, cdb_only.p, dout_r.p, inp.p, w.p, N, C, OC,
                       ld);  // dbias: dout as the GEMMs see it
  Buf<float> dinp[2] = {Buf<float>(inp.n, off), Buf<float>(inp.n, off)},
             dw[2] = {Buf<float>(w.n, off), Buf<float>(w.n, off)}, db[2] = {Buf<float>(OC, off), Buf<float>(OC, off)};
  for (int r = 0; r < 2; ++r) {
    Buf<float> scratch(emu::bias_backward_scratch_bytes(N, OC) / sizeof(float));
    dw[r].copy_from(dw0), db[r].copy_from(db0);
    mm.backward(dinp[r].p, dw[r].p, db[r].p, dout_in, inp_in, w_in, type, N, C, OC, ld, scratch.p);
  }
  CHECK(dinp[0].same(dinp[1]));
  CHECK(dw[0].same(dw[1]));
  CHECK(db[0].same(db[1]));
  const Cmp ei = compare(dinp[0].p, cdinp.p, cdinp.n), ew = compare(dw[0].p, cdw.p, cdw.n),
            eb = compare(db[0].p, cdb_only.p, OC);
  CHECK(ei.nonfinite + ew.nonfinite + eb.nonfinite == 0);
  CHECK(ei.rel() < 1e-5);
  CHECK(ew.rel() < 1e-5);
  CHECK(eb.rel() < 1e-5);
}

}  // namespace

TEST_CASE("cuda_emu: adamw.cu and sum_squares match the CPU twin", "[cuda_emu][adamw]") {
  run_adamw(1, false);
  run_adamw(300, true);
  GridCap cap(2);
  run_adamw(1001, false);
}

TEST_CASE("cuda_emu: adamw.cu's multi-tensor kernels match the CPU twins", "[cuda_emu][adamw]") {
  run_adamw_spans(false);
  run_adamw_spans(true);
}

TEST_CASE("cuda_emu: matmul.cu (cuBLASLt calls, dbias kernels) matches the CPU twin", "[cuda_emu][matmul]") {
  run_matmul(1, 3, 33, 0, false);
  run_matmul(300, 5, 40, 0, false);  // two dbias row chunks
  run_matmul(7, 6, 10, 1, false);    // 4-byte aligned operands: bias added by the kernel
  run_matmul(9, 16, 24, 0, true);    // bf16 GEMM inputs
  // Rows of out and dout padded, as the LM head's logits are (Gpt::logits_stride): fp32 and bf16 inputs.
  run_matmul(300, 8, 65, 0, false, 80);
  run_matmul(9, 16, 65, 0, true, 80);
  // dbias over 3 blocks of 128 columns (4 per thread, the last block partly past OC) and 3 row chunks; bf16 dout
  // read 8 bytes at a time, and rows 4-element aligned but the pointer not (every load one by one).
  run_matmul(600, 8, 300, 0, true);
  run_matmul(520, 4, 260, 1, true);
}
