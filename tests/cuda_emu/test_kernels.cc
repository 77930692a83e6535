// layernorm, crossentropy, embedding, elementwise (residual, dropout, bf16 casts) and gelu run in the CPU emulator of
// the CUDA model, against their CPU twins in kernels/cpu (adamw and matmul: test_kernels_adamw_matmul.cc). Outputs
// start NaN-poisoned (every element must be written) and every kernel runs twice: the results must be bitwise equal.
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

DropoutMask make_drop(float p) {
  DropoutMask d;
  d.p = p;
  d.rng = CounterRng(99, 7);
  d.base = 123457;
  return d;
}

// lo holds f rounded to bf16 (nearest even) bit for bit: the bf16 outputs' contract.
bool rounded_from(const Buf<gpt::bf16>& lo, const Buf<float>& f) {
  if (lo.n != f.n) return false;
  for (size_t i = 0; i < f.n; ++i) {
    if (lo[i].bits != gpt::f32_to_bf16(f[i]).bits) return false;
  }
  return true;
}

void run_layernorm(int64_t N, int C, size_t off) {
  INFO("layernorm N=" << N << " C=" << C << " offset=" << off);
  Buf<float> inp(N * C, off), w(C, off), bias(C, off);
  randn(inp, 2.0f);
  for (size_t i = 0; i < inp.n; ++i) inp[i] += 0.5f;
  randn(w);
  randn(bias);
  Buf<float> cout(N * C), cmean(N), crstd(N);
  cpu::layernorm_forward(cout.p, cmean.p, crstd.p, inp.p, w.p, bias.p, N, C);
  Buf<float> out(N * C, off), mean(N), rstd(N), out2(N * C, off);
  emu::layernorm_forward(out.p, mean.p, rstd.p, inp.p, w.p, bias.p, N, C, nullptr);
  emu::layernorm_forward(out2.p, nullptr, nullptr, inp.p, w.p, bias.p, N, C, nullptr);  // mean/rstd may be null
  CHECK(out.same(out2));
  Buf<gpt::bf16> out_lo(N * C, off);  // the bf16 output (a GEMM input under bf16 compute)
  Buf<float> mean_lo(N), rstd_lo(N);
  emu::layernorm_forward(out_lo.p, mean_lo.p, rstd_lo.p, inp.p, w.p, bias.p, N, C, nullptr);
  CHECK(rounded_from(out_lo, out));
  CHECK(mean_lo.same(mean));
  CHECK(rstd_lo.same(rstd));
  // Backward from the CPU's mean/rstd; the accumulated outputs start from the same random values.
  Buf<float> dout(N * C, off), dinp0(N * C, off), dw0(C), db0(C);
  randn(dout);
  randn(dinp0);
  randn(dw0);
  randn(db0);
  Buf<float> cdinp(N * C), cdw(C), cdb(C);
  cdinp.copy_from(dinp0), cdw.copy_from(dw0), cdb.copy_from(db0);
  cpu::layernorm_backward(cdinp.p, cdw.p, cdb.p, dout.p, inp.p, w.p, cmean.p, crstd.p, N, C);
  const size_t sb = emu::layernorm_backward_scratch_bytes(N, C);
  Buf<float> dinp[2] = {Buf<float>(N * C, off), Buf<float>(N * C, off)}, dw[2] = {Buf<float>(C), Buf<float>(C)},
             db[2] = {Buf<float>(C), Buf<float>(C)};
  for (int r = 0; r < 2; ++r) {
    Buf<float> scratch((sb + 3) / 4);
    dinp[r].copy_from(dinp0), dw[r].copy_from(dw0), db[r].copy_from(db0);
    emu::layernorm_backward(dinp[r].p, dw[r].p, db[r].p, dout.p, inp.p, w.p, cmean.p, crstd.p, N, C, nullptr, scratch.p,
                            nullptr);
  }
  CHECK(dinp[0].same(dinp[1]));
  {  // With the bf16 copy of the accumulated dinp: the same results, and the copy is their rounding.
    Buf<float> scratch((sb + 3) / 4), d3(N * C, off), dw3(C), db3(C);
    Buf<gpt::bf16> lo(N * C, off);
    d3.copy_from(dinp0), dw3.copy_from(dw0), db3.copy_from(db0);
    emu::layernorm_backward(d3.p, dw3.p, db3.p, dout.p, inp.p, w.p, cmean.p, crstd.p, N, C, lo.p, scratch.p, nullptr);
    CHECK(d3.same(dinp[0]));
    CHECK(dw3.same(dw[0]));
    CHECK(rounded_from(lo, d3));
  }
  CHECK(dw[0].same(dw[1]));
  CHECK(db[0].same(db[1]));
  const Cmp cs[] = {compare(out.p, cout.p, out.n),        compare(mean.p, cmean.p, N), compare(rstd.p, crstd.p, N),
                    compare(dinp[0].p, cdinp.p, cdinp.n), compare(dw[0].p, cdw.p, C),  compare(db[0].p, cdb.p, C)};
  const char* names[] = {"out", "mean", "rstd", "dinp", "dweight", "dbias"};
  for (int i = 0; i < 6; ++i) {
    INFO(names[i] << " rel err " << cs[i].rel());
    CHECK(cs[i].nonfinite == 0);
    CHECK(cs[i].rel() < 1e-4);
  }
  // The vectorised (aligned) and scalar (misaligned) paths give the same bits.
  if (off == 0 && C % 4 == 0) {
    Buf<float> i2(N * C, 1), w2(C, 1), b2(C, 1), o2(N * C, 1), d2(N * C, 1), di2(N * C, 1), dw2(C, 1), db2(C, 1);
    i2.copy_from(inp), w2.copy_from(w), b2.copy_from(bias), d2.copy_from(dout), di2.copy_from(dinp0),
        dw2.copy_from(dw0), db2.copy_from(db0);
    emu::layernorm_forward(o2.p, nullptr, nullptr, i2.p, w2.p, b2.p, N, C, nullptr);
    Buf<float> scratch((sb + 3) / 4 + 64);
    emu::layernorm_backward(di2.p, dw2.p, db2.p, d2.p, i2.p, w2.p, cmean.p, crstd.p, N, C, nullptr, scratch.p, nullptr);
    CHECK(o2.same(out));
    CHECK(di2.same(dinp[0]));
    CHECK(dw2.same(dw[0]));
    CHECK(db2.same(db[0]));
  }
}

// The fused residual + LayerNorm equals elementwise.cu's residual then layernorm.cu's LayerNorm bit for bit
// (residual and normalised output, mean, rstd), in place (res_out == res) too, and is close to the CPU's.
void run_residual_layernorm(int64_t N, int C, size_t off, float p, bool inplace) {
  INFO("residual_layernorm N=" << N << " C=" << C << " offset=" << off << " p=" << p << " inplace=" << inplace);
  const DropoutMask drop = p > 0.0f ? make_drop(p) : DropoutMask{};
  Buf<float> res(N * C, off), add(N * C, off), w(C, off), bias(C, off);
  randn(res, 2.0f);
  randn(add);
  randn(w);
  randn(bias);
  // Separate kernels.
  Buf<float> sres(N * C, off), sout(N * C, off), smean(N), srstd(N);
  emu::residual_forward(sres.p, res.p, add.p, N * C, drop, nullptr);
  emu::layernorm_forward(sout.p, smean.p, srstd.p, sres.p, w.p, bias.p, N, C, nullptr);
  // Fused.
  Buf<float> fres(N * C, off), fout(N * C, off), fmean(N), frstd(N);
  if (inplace) fres.copy_from(res);
  emu::residual_layernorm_forward(fres.p, fout.p, fmean.p, frstd.p, inplace ? fres.p : res.p, add.p, w.p, bias.p, N, C,
                                  drop, nullptr);
  CHECK(fres.same(sres));
  CHECK(fout.same(sout));
  CHECK(fmean.same(smean));
  CHECK(frstd.same(srstd));
  // With a bf16 output: the same residual and statistics, the output rounded.
  Buf<float> lres(N * C, off), lmean(N), lrstd(N);
  Buf<gpt::bf16> lout(N * C, off);
  if (inplace) lres.copy_from(res);
  emu::residual_layernorm_forward(lres.p, lout.p, lmean.p, lrstd.p, inplace ? lres.p : res.p, add.p, w.p, bias.p, N, C,
                                  drop, nullptr);
  CHECK(lres.same(sres));
  CHECK(rounded_from(lout, sout));
  CHECK(lmean.same(smean));
  CHECK(lrstd.same(srstd));
  // The CPU twin.
  Buf<float> cres(N * C), cout(N * C), cmean(N), crstd(N);
  cpu::residual_layernorm_forward(cres.p, cout.p, cmean.p, crstd.p, res.p, add.p, w.p, bias.p, N, C, drop);
  const Cmp cr = compare(fres.p, cres.p, cres.n), co = compare(fout.p, cout.p, cout.n);
  INFO("residual rel err " << cr.rel() << ", out rel err " << co.rel());
  CHECK(cr.nonfinite == 0);
  CHECK(co.nonfinite == 0);
  CHECK(cr.rel() < 1e-6);
  CHECK(co.rel() < 1e-4);
}

void run_crossentropy(int64_t N, int V, int Vp, bool inplace, bool with_grad, bool neg_inf) {
  INFO("crossentropy N=" << N << " V=" << V << " Vp=" << Vp << " inplace=" << inplace << " grad=" << with_grad
                         << " -inf=" << neg_inf);
  Buf<float> logits(N * Vp);
  randn(logits, 3.0f);
  for (int64_t i = 0; i < N; ++i)
    for (int j = V; j < Vp; ++j) logits[i * Vp + j] = 1e30f;  // padding must be ignored
  if (neg_inf) logits[0] = -INFINITY;
  Buf<int32_t> targets(N);
  std::uniform_int_distribution<int> ud(0, V - 1);
  for (int64_t i = 0; i < N; ++i) targets[i] = i == 0 ? V - 1 : (i == 1 ? 0 : ud(rng()));
  const float dloss = 0.73f / static_cast<float>(N);
  Buf<float> cl(N), cd(N * Vp), clog(N * Vp);
  clog.copy_from(logits);
  cpu::crossentropy_forward_backward(cl.p, with_grad ? (inplace ? clog.p : cd.p) : nullptr, clog.p, targets.p, N, V, Vp,
                                     dloss);
  if (inplace) cd.copy_from(clog);
  Buf<float> l[2] = {Buf<float>(N), Buf<float>(N)}, d[2] = {Buf<float>(N * Vp), Buf<float>(N * Vp)};
  for (int r = 0; r < 2; ++r) {
    Buf<float> lg(N * Vp);
    lg.copy_from(logits);
    float* dl = with_grad ? (inplace ? lg.p : d[r].p) : nullptr;
    emu::crossentropy_forward_backward(l[r].p, dl, lg.p, targets.p, N, V, Vp, dloss, nullptr);
    if (inplace) d[r].copy_from(lg);
  }
  CHECK(l[0].same(l[1]));
  if (with_grad) CHECK(d[0].same(d[1]));
  if (with_grad) {  // bf16 dlogits (the LM head's GEMM input under bf16 compute): the fp32 ones rounded
    Buf<float> lo_loss(N), lg(N * Vp);
    Buf<gpt::bf16> lo(N * Vp);
    lg.copy_from(logits);
    emu::crossentropy_forward_backward(lo_loss.p, lo.p, lg.p, targets.p, N, V, Vp, dloss, nullptr);
    CHECK(lo_loss.same(l[0]));
    CHECK(rounded_from(lo, d[0]));
  }
  const Cmp el = compare(l[0].p, cl.p, N);
  CHECK(el.nonfinite == 0);
  CHECK(el.rel() < 1e-4);
  // Double reference (tighter than the CPU twin, whose exp sums round in SIMD lanes).
  std::vector<double> rl(N), rd(N * Vp, 0.0);
  for (int64_t i = 0; i < N; ++i) {
    const float* z = logits.p + i * Vp;
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(z[j]));
    for (int j = 0; j < V; ++j) s += std::exp(z[j] - mx);
    rl[i] = mx + std::log(s) - z[targets[i]];
    for (int j = 0; j < V; ++j) rd[i * Vp + j] = std::exp(z[j] - mx) / s * dloss;
    rd[i * Vp + targets[i]] -= dloss;
  }
  CHECK(compare(l[0].p, rl.data(), N).rel() < 1e-5);
  if (with_grad) {
    const Cmp ed = compare(d[0].p, cd.p, N * Vp);
    CHECK(ed.nonfinite == 0);
    CHECK(ed.rel() < 1e-4);
    CHECK(compare(d[0].p, rd.data(), N * Vp).rel() < 1e-5);
    bool pad0 = true;  // the padding's gradient is exactly 0
    for (int64_t i = 0; i < N; ++i)
      for (int j = V; j < Vp; ++j) pad0 &= d[0][i * Vp + j] == 0.0f;
    CHECK(pad0);
  }
  // bf16 logits (the LM head's GEMM output under bf16 compute), read widened: the losses and gradients (fp32, bf16,
  // and bf16 in place over the logits) are bit for bit those of the fp32 logits they widen to, scalar loads and
  // vector loads alike (odd Vp puts rows at every alignment).
  Buf<gpt::bf16> lg_h(N * Vp);
  Buf<float> lg_w(N * Vp);
  for (size_t i = 0; i < lg_h.n; ++i) lg_h[i] = gpt::f32_to_bf16(logits[i]), lg_w[i] = gpt::bf16_to_f32(lg_h[i]);
  Buf<float> wl(N), wd(N * Vp), hl(N), hd(N * Vp);
  emu::crossentropy_forward_backward(wl.p, with_grad ? wd.p : nullptr, lg_w.p, targets.p, N, V, Vp, dloss, nullptr);
  emu::crossentropy_forward_backward(hl.p, with_grad ? hd.p : nullptr, lg_h.p, targets.p, N, V, Vp, dloss, nullptr);
  CHECK(hl.same(wl));
  if (with_grad) {
    CHECK(hd.same(wd));
    Buf<gpt::bf16> sep(N * Vp), inplace(N * Vp);
    inplace.copy_from(lg_h);
    Buf<float> sl(N), il(N);
    emu::crossentropy_forward_backward(sl.p, sep.p, lg_h.p, targets.p, N, V, Vp, dloss, nullptr);
    emu::crossentropy_forward_backward(il.p, inplace.p, inplace.p, targets.p, N, V, Vp, dloss, nullptr);
    CHECK(sl.same(wl));
    CHECK(il.same(wl));
    CHECK(rounded_from(sep, wd));
    CHECK(inplace.same(sep));
  }
}

void run_embedding(int B, int T, int C, int vocab, int distinct) {
  INFO("embedding B=" << B << " T=" << T << " C=" << C << " vocab=" << vocab << " distinct<=" << distinct);
  const int n = B * T;
  Buf<int32_t> tok(n);
  std::uniform_int_distribution<int> ud(0, distinct - 1);
  for (int i = 0; i < n; ++i) tok[i] = (ud(rng()) * 7919) % vocab;  // few ids, so tokens repeat
  Buf<float> wte(static_cast<size_t>(vocab) * C), wpe(static_cast<size_t>(T) * C), out(n * static_cast<size_t>(C)),
      cout(n * static_cast<size_t>(C));
  randn(wte), randn(wpe);
  cpu::embedding_forward(cout.p, tok.p, wte.p, wpe.p, B, T, C);
  emu::embedding_forward(out.p, tok.p, wte.p, wpe.p, B, T, C, nullptr);
  CHECK(out.same(cout));
  Buf<float> dout(n * static_cast<size_t>(C)), dwte0(wte.n), dwpe0(wpe.n), cdwte(wte.n), cdwpe(wpe.n);
  randn(dout), randn(dwte0), randn(dwpe0);
  cdwte.copy_from(dwte0), cdwpe.copy_from(dwpe0);
  cpu::embedding_backward(cdwte.p, cdwpe.p, dout.p, tok.p, B, T, C);
  Buf<float> dwte[2] = {Buf<float>(wte.n), Buf<float>(wte.n)}, dwpe[2] = {Buf<float>(wpe.n), Buf<float>(wpe.n)};
  for (int r = 0; r < 2; ++r) {
    Buf<unsigned char> scratch(emu::embedding_backward_scratch_bytes(B, T));
    dwte[r].copy_from(dwte0), dwpe[r].copy_from(dwpe0);
    emu::embedding_backward(dwte[r].p, dwpe[r].p, dout.p, tok.p, B, T, C, scratch.p, nullptr);
  }
  CHECK(dwte[0].same(dwte[1]));
  CHECK(dwpe[0].same(dwpe[1]));
  // Both sum each token's rows in position order: the same bits as the CPU.
  CHECK(dwte[0].same(cdwte));
  CHECK(dwpe[0].same(cdwpe));
}

// Random parameters rounded to bf16 (lo, `off` elements past a 256-byte boundary) and their fp32 values (f, aligned).
void bf16_params(Buf<gpt::bf16>& lo, Buf<float>& f) {
  randn(f);
  for (size_t i = 0; i < f.n; ++i) {
    lo[i] = gpt::f32_to_bf16(f[i]);
    f[i] = gpt::bf16_to_f32(lo[i]);
  }
}

// Parameters held in bf16 (ShardedParams under bf16 compute), read widened: the LayerNorm forward (plain and fused
// with the residual, fp32 and bf16 outputs), its backward and the embedding forward give what the same kernels give
// on the fp32 values, bit for bit: on the vectorised path (8-byte aligned bf16, C % 4 == 0) and the scalar one.
void run_bf16_params(int64_t N, int C, size_t off) {
  INFO("bf16 parameters N=" << N << " C=" << C << " offset=" << off);
  Buf<gpt::bf16> w_lo(C, off), b_lo(C, off);
  Buf<float> w(C), b(C), inp(N * C), add(N * C);
  bf16_params(w_lo, w);
  bf16_params(b_lo, b);
  randn(inp, 2.0f);
  randn(add);
  const gpt::ConstTensorPtr wl(w_lo.p), bl(b_lo.p);
  {
    Buf<float> o[2] = {Buf<float>(N * C), Buf<float>(N * C)}, m[2] = {Buf<float>(N), Buf<float>(N)},
               r[2] = {Buf<float>(N), Buf<float>(N)};
    emu::layernorm_forward(o[0].p, m[0].p, r[0].p, inp.p, w.p, b.p, N, C, nullptr);
    emu::layernorm_forward(o[1].p, m[1].p, r[1].p, inp.p, wl, bl, N, C, nullptr);
    CHECK(o[1].same(o[0]));
    CHECK(m[1].same(m[0]));
    CHECK(r[1].same(r[0]));
    Buf<gpt::bf16> olo[2] = {Buf<gpt::bf16>(N * C), Buf<gpt::bf16>(N * C)};
    emu::layernorm_forward(olo[0].p, nullptr, nullptr, inp.p, w.p, b.p, N, C, nullptr);
    emu::layernorm_forward(olo[1].p, nullptr, nullptr, inp.p, wl, bl, N, C, nullptr);
    CHECK(olo[1].same(olo[0]));
    // Backward (with the bf16 copy of dinp), from the same accumulated starting values.
    Buf<float> dout(N * C), dinp0(N * C), dw0(C), db0(C);
    randn(dout), randn(dinp0), randn(dw0), randn(db0);
    const size_t sb = emu::layernorm_backward_scratch_bytes(N, C);
    Buf<float> di[2] = {Buf<float>(N * C), Buf<float>(N * C)}, dw[2] = {Buf<float>(C), Buf<float>(C)},
               db[2] = {Buf<float>(C), Buf<float>(C)};
    Buf<gpt::bf16> dlo[2] = {Buf<gpt::bf16>(N * C), Buf<gpt::bf16>(N * C)};
    for (int k = 0; k < 2; ++k) {
      Buf<float> scratch((sb + 3) / 4);
      di[k].copy_from(dinp0), dw[k].copy_from(dw0), db[k].copy_from(db0);
      emu::layernorm_backward(di[k].p, dw[k].p, db[k].p, dout.p, inp.p, k == 0 ? gpt::ConstTensorPtr(w.p) : wl, m[0].p,
                              r[0].p, N, C, dlo[k].p, scratch.p, nullptr);
    }
    CHECK(di[1].same(di[0]));
    CHECK(dw[1].same(dw[0]));
    CHECK(db[1].same(db[0]));
    CHECK(dlo[1].same(dlo[0]));
  }
  {  // The fused residual + LayerNorm, with dropout.
    const DropoutMask drop = make_drop(0.2f);
    Buf<float> res[2] = {Buf<float>(N * C), Buf<float>(N * C)}, o[2] = {Buf<float>(N * C), Buf<float>(N * C)};
    Buf<gpt::bf16> olo[2] = {Buf<gpt::bf16>(N * C), Buf<gpt::bf16>(N * C)};
    emu::residual_layernorm_forward(res[0].p, o[0].p, nullptr, nullptr, inp.p, add.p, w.p, b.p, N, C, drop, nullptr);
    emu::residual_layernorm_forward(res[1].p, o[1].p, nullptr, nullptr, inp.p, add.p, wl, bl, N, C, drop, nullptr);
    CHECK(res[1].same(res[0]));
    CHECK(o[1].same(o[0]));
    emu::residual_layernorm_forward(res[0].p, olo[0].p, nullptr, nullptr, inp.p, add.p, w.p, b.p, N, C, drop, nullptr);
    emu::residual_layernorm_forward(res[1].p, olo[1].p, nullptr, nullptr, inp.p, add.p, wl, bl, N, C, drop, nullptr);
    CHECK(olo[1].same(olo[0]));
  }
  {  // The embedding tables: vocabulary 11, one sequence of T = N tokens.
    const int V = 11, T = static_cast<int>(N);
    Buf<gpt::bf16> te_lo(static_cast<size_t>(V) * C, off), pe_lo(static_cast<size_t>(T) * C, off);
    Buf<float> te(te_lo.n), pe(pe_lo.n);
    bf16_params(te_lo, te);
    bf16_params(pe_lo, pe);
    Buf<int32_t> tok(T);
    for (int t = 0; t < T; ++t) tok[t] = (t * 7 + 3) % V;
    Buf<float> o[2] = {Buf<float>(N * C), Buf<float>(N * C)};
    emu::embedding_forward(o[0].p, tok.p, te.p, pe.p, 1, T, C, nullptr);
    emu::embedding_forward(o[1].p, tok.p, te_lo.p, pe_lo.p, 1, T, C, nullptr);
    CHECK(o[1].same(o[0]));
    CHECK(count_nonfinite(o[1].p, o[1].n) == 0);
  }
}

void run_elementwise(int64_t n, float p) {
  INFO("elementwise n=" << n << " p=" << p << " grid cap=" << emu_grid_cap);
  const DropoutMask dm = make_drop(p);
  Buf<float> res(n), inp(n);
  randn(res), randn(inp);
  {  // residual: out separate (twice) and out aliasing res
    Buf<float> o(n), co(n), o2(n), ra(n);
    cpu::residual_forward(co.p, res.p, inp.p, n, dm);
    emu::residual_forward(o.p, res.p, inp.p, n, dm, nullptr);
    emu::residual_forward(o2.p, res.p, inp.p, n, dm, nullptr);
    // Not bitwise: gpt_engine is built for x86-64-v3, where the CPU twin's res + inp * keep may become an FMA.
    CHECK(compare(o.p, co.p, n).rel() < 1e-6);
    CHECK(o2.same(o));
    ra.copy_from(res);
    emu::residual_forward(ra.p, ra.p, inp.p, n, dm, nullptr);
    CHECK(ra.same(o));
  }
  {  // dropout forward (in place)
    Buf<float> x(n), cx(n);
    x.copy_from(inp), cx.copy_from(inp);
    cpu::dropout_forward(cx.p, n, dm);
    emu::dropout_forward(x.p, n, dm, nullptr);
    CHECK(x.same(cx));
  }
  {  // dropout backward, separate and aliased
    Buf<float> d(n), cd(n), da(n);
    cpu::dropout_backward(cd.p, inp.p, n, dm);
    emu::dropout_backward(d.p, inp.p, n, dm, nullptr);
    CHECK(d.same(cd));
    da.copy_from(inp);
    emu::dropout_backward(da.p, da.p, n, dm, nullptr);
    CHECK(da.same(cd));
  }
  {  // bf16 casts (round to nearest even, NaN stays NaN), with special values
    Buf<float> src(n);
    src.copy_from(inp);
    const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u, 0x00000001u, 0x80000000u,
                                 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0x00800000u};
    for (size_t i = 0; i < std::min<size_t>(n, 11); ++i) std::memcpy(&src[i], &specials[i], 4);
    Buf<gpt::bf16> dst(n), cdst(n);
    for (int64_t i = 0; i < n; ++i) cdst[i] = gpt::f32_to_bf16(src[i]);
    emu::cast_to_bf16(dst.p, src.p, n, nullptr);
    CHECK(dst.same(cdst));
    Buf<float> back(n), cback(n);
    for (int64_t i = 0; i < n; ++i) cback[i] = gpt::bf16_to_f32(cdst[i]);
    emu::cast_from_bf16(back.p, dst.p, n, nullptr);
    CHECK(back.same(cback));
  }
}

void run_gelu(int64_t n) {
  INFO("gelu n=" << n << " grid cap=" << emu_grid_cap);
  Buf<float> x(n), dout(n);
  randn(x, 3.0f), randn(dout);
  if (n > 3) x[0] = 0.0f, x[1] = 1e-3f, x[2] = -20.0f, x[3] = 12.0f;
  Buf<float> o(n), co(n), d(n), cd(n), d2(n);
  cpu::gelu_forward(co.p, x.p, n);
  emu::gelu_forward(o.p, x.p, n, nullptr);
  Buf<gpt::bf16> lo(n);
  emu::gelu_forward(lo.p, x.p, n, nullptr);
  CHECK(rounded_from(lo, o));
  cpu::gelu_backward(cd.p, x.p, dout.p, n);
  emu::gelu_backward(d.p, x.p, dout.p, n, nullptr);
  d2.copy_from(dout);
  emu::gelu_backward(d2.p, x.p, d2.p, n, nullptr);  // dinp aliasing dout, as the model does
  Cmp fo = compare(o.p, co.p, n), bo = compare(d.p, cd.p, n);
  // dinp = dout * gelu'(x), and gelu' passes through 0 (x near -0.75), where a single element's relative error
  // is unbounded: measure the backward against the size of its terms, max |dout| (|gelu'| <= 1.13).
  bo.mag = std::max(bo.mag, compare(dout.p, dout.p, n).mag);
  CHECK(fo.nonfinite + bo.nonfinite == 0);
  CHECK(fo.rel() < 2e-6);
  CHECK(bo.rel() < 2e-6);
  CHECK(d.same(d2));
  // A bf16 input (the fc GEMM's bf16 output): bit for bit the fp32 kernels on the widened values.
  Buf<gpt::bf16> xh(n);
  Buf<float> xw(n), oh(n), ow(n), dh(n), dw(n);
  for (int64_t i = 0; i < n; ++i) xh[i] = gpt::f32_to_bf16(x[i]), xw[i] = gpt::bf16_to_f32(xh[i]);
  emu::gelu_forward(oh.p, gpt::ConstTensorPtr(xh.p), n, nullptr);
  emu::gelu_forward(ow.p, xw.p, n, nullptr);
  CHECK(oh.same(ow));
  emu::gelu_backward(dh.p, gpt::ConstTensorPtr(xh.p), dout.p, n, nullptr);
  emu::gelu_backward(dw.p, xw.p, dout.p, n, nullptr);
  CHECK(dh.same(dw));
  // A bf16 output gradient (the fc GEMM's, a GEMM input under bf16 compute): the fp32 one rounded.
  Buf<gpt::bf16> dlo(n);
  emu::gelu_backward(dlo.p, gpt::ConstTensorPtr(xh.p), dout.p, n, nullptr);
  CHECK(rounded_from(dlo, dh));
  Buf<gpt::bf16> loh(n);
  emu::gelu_forward(loh.p, gpt::ConstTensorPtr(xh.p), n, nullptr);
  CHECK(rounded_from(loh, ow));
  // Tensors one element past 16-byte alignment take the element-by-element path: the same bits as the vector one.
  Buf<float> xu(n, 1), ou(n, 1), du(n, 1), doutu(n, 1);
  Buf<gpt::bf16> xhu(n, 1), lou(n, 1);
  xu.copy_from(x), xhu.copy_from(xh), doutu.copy_from(dout);
  emu::gelu_forward(ou.p, xu.p, n, nullptr);
  CHECK(ou.same(o));
  emu::gelu_backward(du.p, xu.p, doutu.p, n, nullptr);
  CHECK(du.same(d));
  emu::gelu_forward(lou.p, gpt::ConstTensorPtr(xhu.p), n, nullptr);
  CHECK(lou.same(loh));
  emu::gelu_backward(du.p, gpt::ConstTensorPtr(xhu.p), doutu.p, n, nullptr);
  CHECK(du.same(dh));
}

// gelu_backward_bias over N rows of C: dinp bit for bit gelu_backward's, and dbias (accumulated into) bit for bit
// bias_backward's of the dinp stored, for every dtype of the model's paths (In: the GELU input; Grad: dout; Out:
// dinp), dinp aliasing a bf16 dout as the model runs it, and tensors `off` elements past alignment (the
// element-by-element loads). Run twice: the same bits.
template <typename In, typename Grad, typename Out>
void run_gelu_bias(int64_t N, int C, size_t off) {
  constexpr bool in_lo = std::is_same_v<In, gpt::bf16>, grad_lo = std::is_same_v<Grad, gpt::bf16>,
                 out_lo = std::is_same_v<Out, gpt::bf16>;
  INFO("gelu_backward_bias N=" << N << " C=" << C << " off=" << off << " in/grad/out bf16 " << in_lo << grad_lo
                               << out_lo);
  const int64_t n = N * C;
  Buf<float> xf(n), dyf(n);
  randn(xf, 3.0f), randn(dyf);
  Buf<In> x(n, off);
  Buf<Grad> dy(n, off);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<In, gpt::bf16>)
      x[i] = gpt::f32_to_bf16(xf[i]);
    else
      x[i] = xf[i];
    if constexpr (std::is_same_v<Grad, gpt::bf16>)
      dy[i] = gpt::f32_to_bf16(dyf[i]);
    else
      dy[i] = dyf[i];
  }
  Buf<float> db0(C);
  randn(db0);
  Buf<Out> want(n, off);
  emu::gelu_backward(want.p, gpt::ConstTensorPtr(x.p), gpt::ConstTensorPtr(dy.p), n, nullptr);
  Buf<float> want_db(C), scratch(emu::bias_backward_scratch_bytes(N, C) / sizeof(float));
  want_db.copy_from(db0);
  emu::bias_backward(want_db.p, gpt::ConstTensorPtr(want.p), N, C, C, scratch.p, nullptr);
  for (int r = 0; r < 2; ++r) {
    Buf<Out> d(n, off);
    Buf<float> db(C);
    db.copy_from(db0);
    scratch.poison();
    emu::gelu_backward_bias(d.p, db.p, gpt::ConstTensorPtr(x.p), gpt::ConstTensorPtr(dy.p), N, C, scratch.p, nullptr);
    CHECK(d.same(want));
    CHECK(db.same(want_db));
    if constexpr (std::is_same_v<Grad, Out>) {  // in place, as the model runs it (bf16 dpre = bf16 dinp)
      Buf<Out> io(n, off);
      io.copy_from(dy);
      db.copy_from(db0);
      emu::gelu_backward_bias(io.p, db.p, gpt::ConstTensorPtr(x.p), gpt::ConstTensorPtr(io.p), N, C, scratch.p,
                              nullptr);
      CHECK(io.same(want));
      CHECK(db.same(want_db));
    }
  }
  // And close to the CPU's fp32 sums of the same values: the partials' order, not a different quantity.
  Buf<float> wide(n), cdb(C);
  for (int64_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<Out, gpt::bf16>)
      wide[i] = gpt::bf16_to_f32(want[i]);
    else
      wide[i] = want[i];
  }
  cdb.copy_from(db0);
  cpu::bias_backward(cdb.p, wide.p, N, C, C);
  const Cmp e = compare(want_db.p, cdb.p, C);
  CHECK(e.nonfinite == 0);
  CHECK(e.rel() < 1e-5);
}

}  // namespace

TEST_CASE("cuda_emu: layernorm.cu matches the CPU twin", "[cuda_emu][layernorm]") {
  run_layernorm(1, 3, 0);
  run_layernorm(4, 12, 0);  // bf16 rows of 24 bytes: 8-byte stores at rows not 16-byte aligned
  run_layernorm(9, 36, 0);
  run_layernorm(3, 37, 1);
  run_layernorm(20, 130, 0);
  run_layernorm(5, 520, 0);
  run_layernorm(1100, 40, 0);  // 367 row chunks: each partial-sum thread adds every 16th of them
  // GPT-2 XL's width: the backward's accumulators take 7 warps and 87.5 KB of shared memory (past the 48 KB
  // default, so the kernel's opt-in is needed), chunks of 2 rows leave warps idle.
  run_layernorm(600, 1600, 0);
}

TEST_CASE("cuda_emu: the fused residual + layernorm equals the two kernels", "[cuda_emu][layernorm]") {
  run_residual_layernorm(9, 36, 0, 0.0f, false);
  run_residual_layernorm(9, 36, 0, 0.25f, true);
  run_residual_layernorm(3, 37, 1, 0.25f, false);  // scalar path
  run_residual_layernorm(5, 520, 0, 0.1f, false);
  run_residual_layernorm(4, 12, 0, 0.1f, false);
}

TEST_CASE("cuda_emu: crossentropy.cu matches the CPU twin", "[cuda_emu][crossentropy]") {
  run_crossentropy(2, 65, 68, false, true, false);
  run_crossentropy(3, 65, 67, true, true, false);  // in place, Vp > V, odd Vp (rows at every alignment)
  run_crossentropy(2, 7, 9, true, true, false);
  run_crossentropy(2, 65, 65, false, false, false);   // no gradient
  run_crossentropy(1, 2100, 2100, true, true, true);  // several chunks per row, a -inf logit
  // A thread loads 4 groups of 4 columns, 2048 apart, before it uses them (a stride of 8192 per iteration): rows
  // of one whole iteration plus a group, of an iteration whose last groups fall past V for some threads only, and
  // of several iterations at every alignment (odd Vp: scalar loads throughout).
  run_crossentropy(2, 8193, 8196, false, true, false);
  run_crossentropy(2, 6150, 6152, true, true, false);
  run_crossentropy(3, 16390, 16393, true, true, false);
}

TEST_CASE("cuda_emu: embedding.cu matches the CPU twin (repeated tokens)", "[cuda_emu][embedding]") {
  run_embedding(2, 5, 7, 11, 3);
  run_embedding(2, 4, 8, 5, 2);
  run_embedding(3, 6, 36, 1000, 1);  // one token everywhere
  // Runs longer than the dwte block's key window (256) and than the batches of loads (8), in one column pass
  // (C/4 = 130 float4s) and in two (C/4 = 260); and the scalar path (C odd).
  run_embedding(4, 75, 520, 50, 1);
  run_embedding(2, 150, 1040, 50, 1);
  run_embedding(2, 150, 37, 50, 3);
}

TEST_CASE("cuda_emu: bf16 parameters (LayerNorm, embedding) read widened give the fp32 values' results bit for bit",
          "[cuda_emu][layernorm][embedding]") {
  run_bf16_params(9, 36, 0);   // vectorised bf16 loads
  run_bf16_params(9, 36, 1);   // bf16 parameters 2 bytes past an 8-byte boundary: the scalar path
  run_bf16_params(3, 37, 0);   // C % 4 != 0
  run_bf16_params(4, 520, 0);  // several 4-element pieces per lane
}

TEST_CASE("cuda_emu: elementwise.cu (residual, dropout, bf16 casts) matches the CPU twin", "[cuda_emu][elementwise]") {
  for (int64_t n : {1, 300})
    for (float p : {0.0f, 0.1f, 0.5f}) run_elementwise(n, p);
  GridCap cap(2);
  run_elementwise(1000, 0.1f);
}

TEST_CASE("cuda_emu: gelu.cu matches the CPU twin", "[cuda_emu][gelu]") {
  run_gelu(1);
  run_gelu(300);
  GridCap cap(2);
  run_gelu(1001);
}

TEST_CASE("cuda_emu: gelu.cu's backward with the bias gradient equals gelu_backward then bias_backward bit for bit",
          "[cuda_emu][gelu]") {
  using gpt::bf16;
  // One row; 3 row chunks x 3 column blocks (the last partly past C); C not a multiple of 4 (loads one by one);
  // tensors one element past alignment.
  const std::tuple<int64_t, int, size_t> shapes[] = {{1, 3, 0}, {600, 300, 0}, {300, 6, 0}, {520, 260, 1}};
  for (const auto& [N, C, off] : shapes) {
    run_gelu_bias<bf16, bf16, bf16>(N, C, off);     // the model under bf16 compute
    run_gelu_bias<float, float, float>(N, C, off);  // under fp32 compute
    run_gelu_bias<bf16, float, bf16>(N, C, off);
    run_gelu_bias<float, bf16, float>(N, C, off);
  }
}
