// Backend parity of whole steps: a GPT forward and backward on CUDA against the CPU (fp32 and bf16), bf16
// parameters, activation checkpointing, the weight-gradient stream, the profiler, and no allocation after prepare.
#include <catch2/catch.hpp>
#include <cstring>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "comm/communicator.h"
#include "kernels/cuda/workspace.h"
#include "kernels/parity_util.h"
#include "model/activation_checkpointing.h"
#include "model/gpt.h"
#include "model/param_source.h"
#include "testing/scoped_env.h"

namespace gpt {
namespace {

using namespace parity;

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

// fp32: 1e-4 (the bound). bf16 compute (GEMM and attention inputs, P, dS): each rounding is within 2^-9
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
