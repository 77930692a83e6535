// attention.cu (fp32) and attention_tc.cu (bf16 WMMA) run in the CPU emulator of the CUDA model, against the
// CPU twin (kernels/cpu/attention.cc) and, for the tensor-core kernel, a double reference of the same bf16
// math. Shapes are small (the emulator runs every CUDA thread in turn) but cover partial tiles (T not a
// multiple of the tile), several heads and batches, and dropout.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "cuda_bf16.h"
#include "emu_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/kernels.h"
#include "testing/scoped_env.h"

namespace {

using namespace gpt::emu_test;
using gpt::CounterRng;
using gpt::DropoutMask;
namespace emu = gpt::cuda_emu;

float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

// lo holds f rounded to bf16 (nearest even) bit for bit.
bool rounded_from(const Buf<gpt::bf16>& lo, const Buf<float>& f) {
  for (size_t i = 0; i < f.n; ++i) {
    if (lo[i].bits != gpt::f32_to_bf16(f[i]).bits) return false;
  }
  return true;
}

// qkv, the output and dqkv stored in bf16 (the model's storage under bf16 compute): the forward from a bf16 qkv
// gives the fp32 forward's output (from the widened qkv) rounded, and the same lse; the backward from the bf16
// tensors gives the rounded fp32 backward from the widened qkv and output. With `round_out` (the tensor-core
// kernel, whose D takes the output as bf16) the fp32 backward from the unrounded output is that one too.
// forward(qkv, out, lse) and backward(dqkv, qkv, out, lse) run the kernel under test.
template <class Forward, class Backward>
void check_bf16(Forward forward, Backward backward, const Buf<float>& qkv, size_t nout, size_t nlse, bool round_out) {
  Buf<gpt::bf16> qh(qkv.n), oh(nout), dh(qkv.n);
  Buf<float> qw(qkv.n), ow(nout), ow2(nout), lh(nlse), lw(nlse), dw(qkv.n), dw2(qkv.n);
  for (size_t i = 0; i < qkv.n; ++i) qh[i] = gpt::f32_to_bf16(qkv[i]), qw[i] = gpt::bf16_to_f32(qh[i]);
  forward(gpt::ConstTensorPtr(qh.p), gpt::TensorPtr(oh.p), lh.p);
  forward(gpt::ConstTensorPtr(qw.p), gpt::TensorPtr(ow.p), lw.p);
  CHECK(rounded_from(oh, ow));
  CHECK(lh.same(lw));
  for (size_t i = 0; i < nout; ++i) ow2[i] = gpt::bf16_to_f32(oh[i]);
  backward(gpt::TensorPtr(dh.p), gpt::ConstTensorPtr(qh.p), gpt::ConstTensorPtr(oh.p), lh.p);
  backward(gpt::TensorPtr(dw.p), gpt::ConstTensorPtr(qw.p), gpt::ConstTensorPtr(ow2.p), lw.p);
  CHECK(rounded_from(dh, dw));
  CHECK(count_nonfinite(dw.p, qkv.n) == 0);
  if (round_out) {
    backward(gpt::TensorPtr(dw2.p), gpt::ConstTensorPtr(qw.p), gpt::ConstTensorPtr(ow.p), lw.p);
    CHECK(dw2.same(dw));
  }
}

// The kernel pair under test run twice into out/lse/dqkv (bitwise equal runs: determinism; outputs and scratch
// NaN-poisoned before every run), then check_bf16. forward(qkv, out, lse) and backward(dqkv, qkv, out, lse, scratch)
// take float pointers or tensor pointers.
template <class Forward, class Backward>
void run_twice_and_bf16(const Forward& forward, const Backward& backward, const Buf<float>& qkv, size_t scratch_floats,
                        Buf<float> (&out)[2], Buf<float> (&lse)[2], Buf<float> (&dqkv)[2], bool round_out) {
  for (int r = 0; r < 2; ++r) {
    Buf<float> scratch(scratch_floats);
    forward(qkv.p, out[r].p, lse[r].p);
    backward(dqkv[r].p, qkv.p, out[r].p, lse[r].p, scratch.p);
  }
  CHECK(out[0].same(out[1]));
  CHECK(lse[0].same(lse[1]));
  CHECK(dqkv[0].same(dqkv[1]));
  Buf<float> scratch(scratch_floats);
  check_bf16(
      forward, [&](auto d, auto q, auto o, const float* l) { backward(d, q, o, l, scratch.p); }, qkv, out[0].n,
      lse[0].n, round_out);
}

DropoutMask make_drop(float p, uint64_t seed) {
  DropoutMask d;
  d.p = p;
  d.rng = CounterRng(1234 + seed, 77);
  d.base = p > 0 ? 1000003 : 0;
  return d;
}

// lse(B,NH,T) in double.
std::vector<double> reference_lse(const float* qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> lse(static_cast<size_t>(B) * NH * T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double m = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          double d = 0;
          for (int c = 0; c < hs; ++c)
            d += static_cast<double>(qkv[(b * T + t) * C3 + h * hs + c]) * qkv[(b * T + t2) * C3 + C + h * hs + c];
          s[t2] = d * scale;
          m = std::max(m, s[t2]);
        }
        double l = 0;
        for (double x : s) l += std::exp(x - m);
        lse[(static_cast<size_t>(b) * NH + h) * T + t] = m + std::log(l);
      }
  return lse;
}

void run_fp32(int B, int T, int C, int NH, float p) {
  INFO("attention fp32 B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " hs=" << C / NH << " p=" << p);
  const size_t nqkv = static_cast<size_t>(B) * T * 3 * C, nout = static_cast<size_t>(B) * T * C,
               nlse = static_cast<size_t>(B) * NH * T;
  Buf<float> qkv(nqkv), dout(nout);
  randn(qkv, 1.5f);
  randn(dout);
  const DropoutMask drop = make_drop(p, C);

  Buf<float> out[2] = {Buf<float>(nout), Buf<float>(nout)}, lse[2] = {Buf<float>(nlse), Buf<float>(nlse)},
             dqkv[2] = {Buf<float>(nqkv), Buf<float>(nqkv)};
  run_twice_and_bf16([&](auto q, auto o, float* l) { emu::attention_forward(o, l, q, B, T, C, NH, drop, nullptr); },
                     [&](auto d, auto q, auto o, const float* l, float* scratch) {
                       emu::attention_backward(d, dout.p, q, o, l, B, T, C, NH, drop, scratch, nullptr);
                     },
                     qkv, emu::attention_backward_scratch_bytes(B, T, C, NH) / sizeof(float), out, lse, dqkv, false);

  std::vector<float> cout(nout, NAN), att(static_cast<size_t>(B) * NH * T * T, NAN), cdqkv(nqkv, 0.0f);
  gpt::cpu::attention_forward(cout.data(), att.data(), qkv.p, B, T, C, NH, drop);
  gpt::cpu::attention_backward(cdqkv.data(), dout.p, qkv.p, att.data(), B, T, C, NH, drop);
  const std::vector<double> rlse = reference_lse(qkv.p, B, T, C, NH);

  const Cmp eo = compare(out[0].p, cout.data(), nout), el = compare(lse[0].p, rlse.data(), nlse),
            ed = compare(dqkv[0].p, cdqkv.data(), nqkv);
  CHECK(eo.nonfinite == 0);
  CHECK(el.nonfinite == 0);
  CHECK(ed.nonfinite == 0);
  CHECK(eo.rel() < 1e-4);
  CHECK(el.rel() < 1e-4);
  CHECK(ed.rel() < 1e-4);
}

// The bf16 math of the tensor-core kernels in double: roundings of q, k, v, dO, P (times Z) and dS; the 64-key tile
// schedule of the online softmax; the backward from the kernel's output o (rounded to bf16 for D) and lse L.
struct BfReference {
  std::vector<double> out, lse, dqkv;
};
BfReference bf16_reference(const Buf<float>& qkv, const Buf<float>& dout, const Buf<float>& o, const Buf<float>& L,
                           int B, int NH, int hs, int T, const DropoutMask& drop) {
  const int C = NH * hs;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const size_t nqkv = static_cast<size_t>(B) * T * C3, nout = static_cast<size_t>(B) * T * C,
               nlse = static_cast<size_t>(B) * NH * T;
  const float p = drop.p;
  const float keep = p > 0 ? 1.0f / (1.0f - p) : 1.0f;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<double> rout(nout), rlse(nlse), rdqkv(nqkv, 0.0);
  std::vector<float> qb(nqkv), dob(nout);
  for (size_t i = 0; i < nqkv; ++i) qb[i] = bf(qkv[i]);
  for (size_t i = 0; i < nout; ++i) dob[i] = bf(dout[i]);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t base = static_cast<int64_t>(b) * T * C3 + h * hs;
      const int64_t obase = static_cast<int64_t>(b) * T * C + h * hs;
      const uint64_t first = (static_cast<uint64_t>(b) * NH + h) * T * T;
      auto Q = [&](int t, int c) { return static_cast<double>(qb[base + t * C3 + c]); };
      auto K = [&](int t, int c) { return static_cast<double>(qb[base + t * C3 + C + c]); };
      auto V = [&](int t, int c) { return static_cast<double>(qb[base + t * C3 + 2 * C + c]); };
      auto Z = [&](int t, int t2) {
        return p > 0 && drop.rng.uniform(drop.base + first + static_cast<uint64_t>(t) * T + t2) < p ? 0.0f : keep;
      };
      std::vector<double> s(T);
      for (int t = 0; t < T; ++t) {
        for (int t2 = 0; t2 <= t; ++t2) {
          double d = 0;
          for (int c = 0; c < hs; ++c) d += Q(t, c) * K(t2, c);
          s[t2] = d * scale;
        }
        double m = -INFINITY, l = 0;
        std::vector<double> acc(hs, 0.0);
        for (int k0 = 0; k0 <= t; k0 += 64) {
          const int k1 = std::min(t + 1, k0 + 64);
          double mx = -INFINITY;
          for (int t2 = k0; t2 < k1; ++t2) mx = std::max(mx, s[t2]);
          const double mn = std::max(m, mx), alpha = std::exp(m - mn);
          l *= alpha;
          for (auto& x : acc) x *= alpha;
          for (int t2 = k0; t2 < k1; ++t2) {
            const double pe = std::exp(s[t2] - mn);
            l += pe;
            const double pz = bf(static_cast<float>(pe) * Z(t, t2));
            for (int c = 0; c < hs; ++c) acc[c] += pz * V(t2, c);
          }
          m = mn;
        }
        for (int c = 0; c < hs; ++c) rout[obase + t * C + c] = acc[c] / l;
        rlse[(static_cast<int64_t>(b) * NH + h) * T + t] = m + std::log(l);
      }
      // Backward from the kernel's out (rounded to bf16 for D) and lse (as the kernel reads them).
      for (int t = 0; t < T; ++t) {
        double dv = 0;
        for (int c = 0; c < hs; ++c) dv += static_cast<double>(dout[obase + t * C + c]) * bf(o[obase + t * C + c]);
        const double lt = L[(static_cast<int64_t>(b) * NH + h) * T + t];
        for (int t2 = 0; t2 <= t; ++t2) {
          double d = 0, e = 0;
          for (int c = 0; c < hs; ++c) {
            d += Q(t, c) * K(t2, c);
            e += static_cast<double>(dob[obase + t * C + c]) * V(t2, c);
          }
          const double pe = std::exp(d * scale - lt);
          const float z = Z(t, t2);
          const double pz = bf(static_cast<float>(pe) * z);
          const double ds = bf(static_cast<float>(pe * (z * e - dv)));
          for (int c = 0; c < hs; ++c) {
            rdqkv[base + t2 * C3 + 2 * C + c] += pz * dob[obase + t * C + c];
            rdqkv[base + t2 * C3 + C + c] += scale * ds * Q(t, c);
            rdqkv[base + t * C3 + c] += scale * ds * K(t2, c);
          }
        }
      }
    }
  }
  return {std::move(rout), std::move(rlse), std::move(rdqkv)};
}

// attention_tc against (1) a double reference of the same bf16 math (roundings of q, k, v, dO, P and dS;
// the 64-key tile schedule of the online softmax): max error 1e-3 of max, l2 1e-4; (2) the fp32 CPU twin:
// l2 1.5e-2 (bf16 precision). These are the tolerances the kernel was verified with.
void run_tc(int B, int NH, int hs, int T, float p) {
  INFO("attention_tc B=" << B << " NH=" << NH << " hs=" << hs << " T=" << T << " p=" << p);
  const int C = NH * hs;
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const size_t nqkv = static_cast<size_t>(B) * T * C3, nout = static_cast<size_t>(B) * T * C,
               nlse = static_cast<size_t>(B) * NH * T;
  Buf<float> qkv(nqkv), dout(nout);
  randn(qkv);
  randn(dout);
  const DropoutMask drop = make_drop(p, hs);
  REQUIRE(emu::attention_tc_supported(C, NH));

  Buf<float> out[2] = {Buf<float>(nout), Buf<float>(nout)}, lse[2] = {Buf<float>(nlse), Buf<float>(nlse)},
             dqkv[2] = {Buf<float>(nqkv), Buf<float>(nqkv)};
  run_twice_and_bf16([&](auto q, auto o, float* l) { emu::attention_forward_tc(o, l, q, B, T, C, NH, drop, nullptr); },
                     [&](auto d, auto q, auto o, const float* l, float* scratch) {
                       emu::attention_backward_tc(d, dout.p, q, o, l, B, T, C, NH, drop, scratch, nullptr);
                     },
                     qkv, emu::attention_backward_scratch_bytes(B, T, C, NH) / sizeof(float), out, lse, dqkv, true);
  const Buf<float>& o = out[0];
  const Buf<float>& L = lse[0];

  const BfReference ref = bf16_reference(qkv, dout, o, L, B, NH, hs, T, drop);
  const std::vector<double>&rout = ref.out, &rlse = ref.lse, &rdqkv = ref.dqkv;
  std::vector<float> cout(nout, NAN), att(static_cast<size_t>(B) * NH * T * T, NAN), cdqkv(nqkv, 0.0f);
  gpt::cpu::attention_forward(cout.data(), att.data(), qkv.p, B, T, C, NH, drop);
  gpt::cpu::attention_backward(cdqkv.data(), dout.p, qkv.p, att.data(), B, T, C, NH, drop);

  const Cmp eo = compare(o.p, rout.data(), nout), el = compare(L.p, rlse.data(), nlse),
            ed = compare(dqkv[0].p, rdqkv.data(), nqkv);
  const Cmp co = compare(o.p, cout.data(), nout), cd = compare(dqkv[0].p, cdqkv.data(), nqkv);
  CHECK(eo.nonfinite + el.nonfinite + ed.nonfinite == 0);
  CHECK(eo.rel() < 1e-3);
  CHECK(el.rel() < 1e-3);
  CHECK(ed.rel() < 1e-3);
  CHECK(std::max({eo.rel_l2(), el.rel_l2(), ed.rel_l2()}) < 1e-4);
  CHECK(co.rel_l2() < 1.5e-2);
  CHECK(cd.rel_l2() < 1.5e-2);
}

// Every element of got (bf16 widened) within its own rounding (2^-8 relative) plus `tol` of max |ref| of ref.
double excess_over_bf16(const float* got, const double* ref, size_t n) {
  double mag = 0, worst = 0;
  for (size_t i = 0; i < n; ++i) mag = std::max(mag, std::abs(ref[i]));
  for (size_t i = 0; i < n; ++i) {
    const double d = std::isfinite(got[i]) ? std::abs(got[i] - ref[i]) - std::ldexp(std::abs(ref[i]), -8) : INFINITY;
    worst = std::max(worst, d);
  }
  return mag > 0 ? worst / mag : worst;
}

// attention_mma (bf16 qkv, out and dqkv only) against the same double reference of the bf16 math as attention_tc:
// max error 1e-3 of max beyond each element's bf16 rounding; lse (fp32) 1e-3 of max and l2 1e-4; and the fp32
// CPU twin: l2 1.5e-2. Run twice: bitwise equal (outputs and scratch poisoned before each run).
void run_mma(int B, int NH, int hs, int T, float p) {
  INFO("attention_mma B=" << B << " NH=" << NH << " hs=" << hs << " T=" << T << " p=" << p);
  const int C = NH * hs;
  const size_t nqkv = static_cast<size_t>(B) * T * 3 * C, nout = static_cast<size_t>(B) * T * C,
               nlse = static_cast<size_t>(B) * NH * T;
  Buf<float> qkv(nqkv), dout(nout);
  randn(qkv);
  randn(dout);
  for (size_t i = 0; i < nqkv; ++i) qkv[i] = bf(qkv[i]);  // the kernel's input is bf16: the reference's too
  const DropoutMask drop = make_drop(p, hs);
  REQUIRE(emu::attention_mma_supported(C, NH));

  Buf<gpt::bf16> qh(nqkv), doh(nout);
  for (size_t i = 0; i < nqkv; ++i) qh[i] = gpt::f32_to_bf16(qkv[i]);
  for (size_t i = 0; i < nout; ++i) {  // the kernel's dO is bf16 (the model's): the references read its values
    doh[i] = gpt::f32_to_bf16(dout[i]);
    dout[i] = gpt::bf16_to_f32(doh[i]);
  }
  Buf<gpt::bf16> out[2] = {Buf<gpt::bf16>(nout), Buf<gpt::bf16>(nout)},
                 dqkv[2] = {Buf<gpt::bf16>(nqkv), Buf<gpt::bf16>(nqkv)};
  Buf<float> lse[2] = {Buf<float>(nlse), Buf<float>(nlse)};
  // The qkv bias gradient, added to what is there (0.5): by the wgmma kernels (the emulated sm_90 at head size 64
  // without dropout, where the backward keeps dS^T), else left to the caller.
  const size_t nbias = 3 * static_cast<size_t>(C);
  Buf<float> bias[2] = {Buf<float>(nbias), Buf<float>(nbias)};
  bool summed[2] = {false, false};
  const size_t scratch_bytes = emu::attention_backward_mma_scratch_bytes(B, T, C, NH, drop.active());
  for (int r = 0; r < 2; ++r) {
    Buf<unsigned char> scratch(scratch_bytes);
    std::memset(scratch.p, 0xff, scratch_bytes);  // NaN as fp32 and as bf16
    for (size_t i = 0; i < nbias; ++i) bias[r][i] = 0.5f;
    emu::attention_forward_mma(gpt::TensorPtr(out[r].p), lse[r].p, gpt::ConstTensorPtr(qh.p), B, T, C, NH, drop,
                               nullptr);
    summed[r] = emu::attention_backward_mma(gpt::TensorPtr(dqkv[r].p), doh.p, gpt::ConstTensorPtr(qh.p),
                                            gpt::ConstTensorPtr(out[r].p), lse[r].p, B, T, C, NH, drop, bias[r].p,
                                            scratch.p, nullptr);
  }
  CHECK(out[0].same(out[1]));
  CHECK(lse[0].same(lse[1]));
  CHECK(dqkv[0].same(dqkv[1]));
  CHECK(bias[0].same(bias[1]));
  const bool wgmma = hs == 64 && p == 0.0f && std::getenv("GPT_ATTENTION_WGMMA") == nullptr &&
                     std::getenv("GPT_ATTENTION_DQ") == nullptr && std::getenv("GPT_ATTENTION_WGMMA_BIAS") == nullptr;
  CHECK(summed[0] == wgmma);
  CHECK(summed[1] == wgmma);
  {  // 0.5 + each column's sum of dqkv as stored, within fp32 rounding of the sum of magnitudes
    double worst = 0;
    for (size_t c = 0; c < nbias; ++c) {
      double sum = 0.5, mag = 0.5;
      if (summed[0]) {
        for (size_t row = 0; row < static_cast<size_t>(B) * T; ++row) {
          const double v = gpt::bf16_to_f32(dqkv[0][row * nbias + c]);
          sum += v, mag += std::abs(v);
        }
      }
      const double err = std::isfinite(bias[0][c]) ? std::abs(bias[0][c] - sum) / mag : INFINITY;
      worst = std::max(worst, err);
    }
    CHECK(worst <= (summed[0] ? 4e-6 : 0.0));  // fp32 sums of up to 16 rows, then of the chunks: ~(16 + B T / 16) 2^-24
  }

  Buf<float> o(nout), d(nqkv);
  for (size_t i = 0; i < nout; ++i) o[i] = gpt::bf16_to_f32(out[0][i]);
  for (size_t i = 0; i < nqkv; ++i) d[i] = gpt::bf16_to_f32(dqkv[0][i]);
  const BfReference ref = bf16_reference(qkv, dout, o, lse[0], B, NH, hs, T, drop);
  std::vector<float> cout(nout, NAN), att(static_cast<size_t>(B) * NH * T * T, NAN), cdqkv(nqkv, 0.0f);
  gpt::cpu::attention_forward(cout.data(), att.data(), qkv.p, B, T, C, NH, drop);
  gpt::cpu::attention_backward(cdqkv.data(), dout.p, qkv.p, att.data(), B, T, C, NH, drop);

  const Cmp el = compare(lse[0].p, ref.lse.data(), nlse);
  const Cmp co = compare(o.p, cout.data(), nout), cd = compare(d.p, cdqkv.data(), nqkv);
  CHECK(co.nonfinite + el.nonfinite + cd.nonfinite == 0);
  CHECK(excess_over_bf16(o.p, ref.out.data(), nout) < 1e-3);
  CHECK(excess_over_bf16(d.p, ref.dqkv.data(), nqkv) < 1e-3);
  CHECK(el.rel() < 1e-3);
  CHECK(el.rel_l2() < 1e-4);
  CHECK(co.rel_l2() < 1.5e-2);
  CHECK(cd.rel_l2() < 1.5e-2);
}

}  // namespace

TEST_CASE("cuda_emu: attention.cu fp32 forward and backward match the CPU twin", "[cuda_emu][attention]") {
  run_fp32(2, 1, 16, 2, 0.0f);    // hs 8, one row
  run_fp32(2, 37, 16, 2, 0.0f);   // hs 8, partial tile
  run_fp32(1, 37, 16, 2, 0.2f);   // hs 8, dropout
  run_fp32(1, 70, 64, 1, 0.0f);   // hs 64, two tiles, the second partial
  run_fp32(2, 33, 128, 2, 0.3f);  // hs 64, dropout, two batches
  run_fp32(1, 65, 48, 1, 0.1f);   // hs 48 (padded to 64), dropout
  run_fp32(1, 17, 128, 1, 0.2f);  // hs 128
}

TEST_CASE("cuda_emu: attention_tc.cu forward and backward match the bf16 reference and the CPU twin",
          "[cuda_emu][attention_tc]") {
  run_tc(1, 2, 32, 17, 0.0f);
  run_tc(2, 1, 32, 65, 0.2f);  // two key tiles, the second one row
  run_tc(1, 2, 64, 17, 0.2f);
  run_tc(1, 1, 64, 70, 0.0f);
  run_tc(1, 1, 128, 70, 0.1f);  // head size 128: K, V (Q, dO) tiles in shared memory, not in registers
}

TEST_CASE("cuda_emu: attention_mma.cu forward and backward match the bf16 reference and the CPU twin",
          "[cuda_emu][attention_mma]") {
  run_mma(1, 2, 32, 17, 0.0f);
  run_mma(2, 1, 32, 130, 0.2f);  // query tiles of 128 rows (two warps' m-tiles each), three key tiles, the last one row
  run_mma(1, 2, 64, 17, 0.2f);
  run_mma(1, 1, 64, 150, 0.0f);   // a key tile past the first warps' rows; the last query tile mostly padding
  run_mma(1, 1, 128, 70, 0.1f);   // head size 128: one m-tile per warp; K, V (Q, dO) read from shared memory
  run_mma(1, 1, 128, 100, 0.0f);  // dK/dV over query tiles of 32
  // Tiles refilled while other warps may still read them: three query tiles, so the block of the last one (where
  // only warp 0 has rows) is odd for the second head and the emulator runs its warps last to first.
  run_mma(1, 2, 32, 260, 0.0f);
  run_mma(1, 2, 128, 200, 0.0f);
  // At head sizes 32 and 64 without dropout the dK/dV kernel keeps dS^T in the scratch (poisoned NaN: the dQ kernel
  // must read only the blocks it wrote) and the dQ kernel multiplies it; GPT_ATTENTION_DQ=recompute recomputes it there
  // as the other configurations do.
  ::setenv("GPT_ATTENTION_DQ", "recompute", 1);
  run_mma(1, 1, 64, 150, 0.0f);
  run_mma(1, 2, 32, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_DQ");
  // The emulated GPU is an sm_90: at head size 64 without dropout the kernels above were attention_wgmma.cu's where
  // the backward keeps dS^T (its own cases: three query tiles, the last mostly padding; two heads of 260 rows), the
  // forward only where it recomputes. GPT_ATTENTION_WGMMA=0: the mma.sync ones.
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(2, 1, 64, 150, 0.0f);  // two sequences: the bias partials' rows per sequence (ceil(150 / 16) = 10)
  run_mma(3, 1, 64, 200, 0.0f);  // 39 rows of partials: groups of 2 in the first pass, the last of 1, 12 empty
  ::setenv("GPT_ATTENTION_WGMMA_DS_STAGE", "0", 1);  // dS^T from the fragments: the staging rows the sums read differ
  run_mma(1, 2, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_DS_STAGE");
  ::setenv("GPT_ATTENTION_WGMMA_BIAS", "0", 1);  // the qkv bias gradient left to the caller, as before the kernels
  run_mma(1, 2, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BIAS");
  ::setenv("GPT_ATTENTION_WGMMA_BQ", "64", 1);  // its dK/dV kernel at 64 queries per step
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  // The overlapped kernels (GPT_ATTENTION_WGMMA_OVERLAP=1: forward and dK/dV; T 150 gives query tiles of 1, 2 and
  // 3 key tiles, both ends of the forward's two-iteration loop).
  ::setenv("GPT_ATTENTION_WGMMA_OVERLAP", "1", 1);
  run_mma(1, 2, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_OVERLAP");
  // Blocks of two warpgroups (GPT_ATTENTION_WGMMA_WG2=1: forward, dK/dV and dQ), at 32 and 64 queries per dK/dV
  // step; T 214: the last block's second warpgroup has 22 rows (keys), T 150: its first has 22 and its second none,
  // T 64: one block, its second warpgroup without rows.
  ::setenv("GPT_ATTENTION_WGMMA_WG2", "1", 1);
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 214, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  run_mma(2, 1, 64, 64, 0.0f);
  ::setenv("GPT_ATTENTION_WGMMA_BQ", "64", 1);
  run_mma(1, 1, 64, 214, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
  // The forward on key tiles of 128 (GPT_ATTENTION_WGMMA_BK=128; not bit for bit the default's: its online softmax
  // steps by 128 keys), with one and two warpgroups: T 150 ends in a partial tile, 260 in one of 4 keys.
  ::setenv("GPT_ATTENTION_WGMMA_BK", "128", 1);
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 214, 0.0f);
  run_mma(2, 1, 64, 64, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_WG2");
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BK");
  // The warp-specialised forward (GPT_ATTENTION_WGMMA_WS: 2 or 3 consumer warpgroups, a producer warp, a ring of
  // three stages). T 64: a block whose later warpgroups have no rows; 150, 260 and 600 at 3 (blocks of 192 rows):
  // warpgroups whose rows end before the block's last key tile (they release it unread; at 2 the 128-row blocks
  // match the key tiles); 600: five key tiles, the ring refilled, blocks of both thread orders.
  for (const char* ws : {"2", "3"}) {
    ::setenv("GPT_ATTENTION_WGMMA_WS", ws, 1);
    run_mma(2, 1, 64, 64, 0.0f);
    run_mma(1, 1, 64, 150, 0.0f);
    run_mma(1, 2, 64, 260, 0.0f);
    run_mma(1, 1, 64, 600, 0.0f);
  }
  ::unsetenv("GPT_ATTENTION_WGMMA_WS");
  // The warp-specialised dK/dV kernel (GPT_ATTENTION_WGMMA_WS_KV=2: a producer warp, two consumer warpgroups of 64
  // keys, a ring of three query stages), at 32 and 64 queries per step, with K and V in registers too. T 64 and 150:
  // a block whose second warpgroup has no keys; 260 and 600: the ring refilled many times (at 32 queries, 19 tiles).
  ::setenv("GPT_ATTENTION_WGMMA_WS_KV", "2", 1);
  run_mma(2, 1, 64, 64, 0.0f);
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 600, 0.0f);
  ::setenv("GPT_ATTENTION_WGMMA_BQ", "64", 1);
  run_mma(1, 1, 64, 150, 0.0f);
  run_mma(1, 1, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
  ::setenv("GPT_ATTENTION_WGMMA_RS", "kv", 1);
  run_mma(1, 1, 64, 150, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_RS");
  ::setenv("GPT_ATTENTION_WGMMA_OVERLAP", "bwd", 1);  // its element-wise work overlapping its products
  run_mma(1, 1, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_OVERLAP");
  // Three consumer warpgroups (=3: blocks of 192 keys). T 64: one block, its last two warpgroups without keys; 150:
  // the last with none; 600: four blocks, warpgroups starting past the block's first query tiles; overlapped at 32
  // queries per step.
  ::setenv("GPT_ATTENTION_WGMMA_WS_KV", "3", 1);
  run_mma(2, 1, 64, 64, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  run_mma(1, 2, 64, 600, 0.0f);
  ::setenv("GPT_ATTENTION_WGMMA_BQ", "64", 1);
  run_mma(1, 1, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
  ::setenv("GPT_ATTENTION_WGMMA_OVERLAP", "bwd", 1);
  run_mma(1, 1, 64, 260, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_OVERLAP");
  ::unsetenv("GPT_ATTENTION_WGMMA_WS_KV");
  // The forward's Q and the dK/dV kernel's K and V as A fragments in registers (GPT_ATTENTION_WGMMA_RS=1), at 32 and
  // 64 queries per dK/dV step.
  ::setenv("GPT_ATTENTION_WGMMA_RS", "1", 1);
  run_mma(1, 2, 64, 260, 0.0f);
  run_mma(1, 1, 64, 150, 0.0f);
  ::setenv("GPT_ATTENTION_WGMMA_BQ", "64", 1);
  run_mma(1, 1, 64, 214, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA_BQ");
  ::unsetenv("GPT_ATTENTION_WGMMA_RS");
  ::setenv("GPT_ATTENTION_WGMMA", "fwd", 1);  // the wgmma forward, the mma.sync backward
  run_mma(1, 1, 64, 150, 0.0f);
  ::setenv("GPT_ATTENTION_WGMMA", "0", 1);
  run_mma(1, 1, 64, 150, 0.0f);
  ::unsetenv("GPT_ATTENTION_WGMMA");
}

namespace {

// One forward and backward's out, lse and dqkv, as bytes. kind 0: attention.cu (fp32), 1: attention_tc.cu (bf16),
// 2: attention_mma.cu (bf16; attention_wgmma.cu's kernels where the emulated sm_90 takes them).
std::vector<unsigned char> attention_bytes(int kind, int B, int NH, int hs, int T, float p) {
  const int C = NH * hs;
  const size_t nqkv = static_cast<size_t>(B) * T * 3 * C, nout = static_cast<size_t>(B) * T * C,
               nlse = static_cast<size_t>(B) * NH * T;
  rng().seed(4242);  // the same inputs every call
  Buf<float> qkv(nqkv), dout(nout), lse(nlse);
  randn(qkv);
  randn(dout);
  const DropoutMask drop = make_drop(p, hs);
  std::vector<unsigned char> bytes;
  auto keep = [&bytes](const auto& buf) {
    const auto* b = reinterpret_cast<const unsigned char*>(buf.p);
    bytes.insert(bytes.end(), b, b + buf.n * sizeof(*buf.p));
  };
  if (kind == 0) {
    Buf<float> out(nout), dqkv(nqkv), scratch(emu::attention_backward_scratch_bytes(B, T, C, NH) / sizeof(float));
    emu::attention_forward(gpt::TensorPtr(out.p), lse.p, gpt::ConstTensorPtr(qkv.p), B, T, C, NH, drop, nullptr);
    emu::attention_backward(gpt::TensorPtr(dqkv.p), gpt::ConstTensorPtr(dout.p), gpt::ConstTensorPtr(qkv.p),
                            gpt::ConstTensorPtr(out.p), lse.p, B, T, C, NH, drop, scratch.p, nullptr);
    keep(out), keep(lse), keep(dqkv);
    return bytes;
  }
  Buf<gpt::bf16> qh(nqkv), doh(nout), out(nout), dqkv(nqkv);
  for (size_t i = 0; i < nqkv; ++i) qh[i] = gpt::f32_to_bf16(qkv[i]);
  for (size_t i = 0; i < nout; ++i) doh[i] = gpt::f32_to_bf16(dout[i]);
  if (kind == 1) {
    Buf<float> scratch(emu::attention_backward_scratch_bytes(B, T, C, NH) / sizeof(float));
    emu::attention_forward_tc(gpt::TensorPtr(out.p), lse.p, gpt::ConstTensorPtr(qh.p), B, T, C, NH, drop, nullptr);
    emu::attention_backward_tc(gpt::TensorPtr(dqkv.p), gpt::ConstTensorPtr(doh.p), gpt::ConstTensorPtr(qh.p),
                               gpt::ConstTensorPtr(out.p), lse.p, B, T, C, NH, drop, scratch.p, nullptr);
  } else {
    const size_t scratch_bytes = emu::attention_backward_mma_scratch_bytes(B, T, C, NH, drop.active());
    Buf<unsigned char> scratch(scratch_bytes);
    std::memset(scratch.p, 0xff, scratch_bytes);  // NaN as fp32 and as bf16
    emu::attention_forward_mma(gpt::TensorPtr(out.p), lse.p, gpt::ConstTensorPtr(qh.p), B, T, C, NH, drop, nullptr);
    emu::attention_backward_mma(gpt::TensorPtr(dqkv.p), doh.p, gpt::ConstTensorPtr(qh.p), gpt::ConstTensorPtr(out.p),
                                lse.p, B, T, C, NH, drop, nullptr, scratch.p, nullptr);
  }
  keep(out), keep(lse), keep(dqkv);
  return bytes;
}

}  // namespace

// The tile order (kernels/cuda/tile_order.h) moves each block to another (tile, head) and nothing else: every causal
// attention kernel gives the bits of the head-by-head order (GPT_ATTENTION_ORDER=head) with its heads in sections of
// 1, 2 and 3 (an L2 cache made small enough: 5 heads as 2, 2, 1 and as 3, 2) and in one section. 5 heads of T 150:
// 3 query tiles of 64 (2 of 128 in the two-warpgroup kernels), so ranks and heads both move. A tile computed twice
// or never (NaN-poisoned outputs and scratch) differs.
TEST_CASE("cuda_emu: every attention kernel gives the same bits in either tile order", "[cuda_emu][attention_order]") {
  struct Config {
    int kind;
    float p;
    std::vector<std::pair<const char*, const char*>> env;
    const char* what;
  };
  const std::vector<Config> configs = {
      {0, 0.1f, {}, "attention.cu"},
      {1, 0.1f, {}, "attention_tc.cu"},
      {2, 0.1f, {}, "mma.sync, dropout"},
      {2, 0.0f, {{"GPT_ATTENTION_WGMMA", "0"}}, "mma.sync, dS^T kept"},
      {2, 0.0f, {{"GPT_ATTENTION_WGMMA", "0"}, {"GPT_ATTENTION_DQ", "recompute"}}, "mma.sync, 3 blocks per SM"},
      {2, 0.0f, {}, "wgmma"},
      {2, 0.0f, {{"GPT_ATTENTION_WGMMA_WG2", "1"}, {"GPT_ATTENTION_WGMMA_OVERLAP", "fwd"}}, "wgmma WG2, overlap"},
  };
  const int B = 1, NH = 5, hs = 64, T = 150;
  struct RestoreL2 {
    int bytes = emu_l2_bytes();
    ~RestoreL2() { emu_l2_bytes() = bytes; }
  } restore;
  for (const Config& c : configs) {
    CAPTURE(c.what);
    std::vector<std::unique_ptr<gpt::testing::ScopedEnv>> env;
    for (const auto& [name, value] : c.env) env.push_back(std::make_unique<gpt::testing::ScopedEnv>(name, value));
    const int head_bytes = 2 * T * hs * (c.kind == 0 ? 4 : 2);  // K and V (Q and dO) of one head
    std::vector<unsigned char> head;
    {
      const gpt::testing::ScopedEnv order("GPT_ATTENTION_ORDER", "head");
      head = attention_bytes(c.kind, B, NH, hs, T, c.p);
    }
    for (const int heads_per_section : {1, 2, 3, 5}) {
      CAPTURE(heads_per_section);
      emu_l2_bytes() = heads_per_section == 5 ? 50 << 20 : 2 * heads_per_section * head_bytes + 1;
      CHECK(attention_bytes(c.kind, B, NH, hs, T, c.p) == head);
    }
  }
}
