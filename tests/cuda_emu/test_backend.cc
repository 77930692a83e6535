// The CUDA backend's host code (kernels/cuda/cuda_backend{,_ops}.cu, converted like the kernels: the dispatch to the
// kernels, the bf16 cast areas, the tensor-core attention choice, reserve) over the emulated kernels and
// cuBLASLt, driving the whole model as the trainer does, against the CPU backend. What the [cuda] tests check
// on a GPU, here without one (the emulator's limits in README.md apply: no GPU numerics or memory model).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/atomic_file.h"
#include "kernels/cuda/cuda_backend.h"  // the converted one: gpt::CudaEmuBackend
#include "model/gpt.h"
#include "model/inference_weights.h"
#include "model/widened_params.h"
#include "optim/adamw.h"
#include "parallel/sharded_params.h"
#include "run_aborting.h"
#include "testing/scoped_env.h"
#include "testing/temp_dir.h"

namespace {

using namespace gpt;

struct Run {
  std::vector<float> losses;      // per step
  float eval = 0.0f;              // after the steps
  std::vector<float> grads;       // the first step's gradient of the local master region, host copy
  std::vector<float> weights;     // the fp32 master weights after the steps
  int64_t first_allocations = 0;  // tracked allocations in the first forward/backward, after prepare
  int64_t later_allocations = 0;  // those after the first step (span tables and zero3's pools fill in it)
};

struct Setup {
  const char* ckpt = "none";
  int64_t head_rows = Gpt::kHeadRows;
  DType param = DType::kF32;              // ShardingOptions::param_dtype
  std::optional<DType> gemm_inputs;       // Gpt::set_gemm_input_dtype, else the compute dtype
  bool widen = false;                     // bf16 parameters widened to fp32 copies (GEMMs cast the weights)
  Strategy strategy = Strategy::kSingle;  // over one rank: zero3 gathers (and keeps bf16 copies of) each unit
};

constexpr float kLr = 1e-3f;

// Two optimizer steps of one micro-batch each and an eval, as the trainer runs them: forward/backward, the
// gradient norm, clipping and AdamW (the multi-tensor kernels, writing the bf16 copy under param_dtype bf16).
Run run(Backend& be, const GptShape& shape, int B, int T, const Setup& s) {
  Gpt model(shape, be, *ActivationCheckpointing::parse(s.ckpt));
  model.set_head_rows(s.head_rows);
  if (s.gemm_inputs) model.set_gemm_input_dtype(*s.gemm_inputs);
  auto single = make_single_communicator();
  ShardingOptions options;
  options.param_dtype = s.param;
  ShardedParams params(model.layout(), be, *single, s.strategy, nullptr, options);
  params.init(shape, 9);
  AdamW opt(be, model.layout(), params.regions(), params.local_numel(), AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
  model.prepare(B, T);
  testing::WidenedParams widened(params, be, model.layout());
  ParamSource& source = s.widen ? static_cast<ParamSource&>(widened) : params;
  const CounterRng rng(5, 5);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  Run r;
  auto allocations = [] { return MemTracker::instance().stats().allocations; };
  int64_t mark = allocations();
  for (int step = 0; step < 2; ++step) {
    for (int i = 0; i < B * T; ++i) {
      inputs[i] = static_cast<int32_t>(rng.u32(step * 1000 + i) % shape.vocab_size);
      targets[i] = static_cast<int32_t>(rng.u32(step * 1000 + 500 + i) % shape.vocab_size);
    }
    params.begin_micro_batch(true, true);
    r.losses.push_back(
        model.forward_backward(source, inputs.data(), targets.data(), 1.0f / (B * T), StepContext{3, step, 0, true}));
    params.finish_grads();
    if (step == 0) {
      r.first_allocations = allocations() - mark;
      r.grads.resize(params.local_numel());
      be.to_host(r.grads.data(), params.local_grads(), r.grads.size() * sizeof(float));
    }
    const double norm = std::sqrt(params.grad_sq_norm());
    opt.step(params.master(), params.local_grads(), kLr, norm > 0.5 ? static_cast<float>(0.5 / norm) : 1.0f,
             params.master_lo(), params.rounding(opt.steps_taken() + 1));
    params.publish(opt.steps_taken(), /*lo_written=*/true);
    if (step == 0) mark = allocations();
  }
  r.eval = model.forward_loss(source, inputs.data(), targets.data(), StepContext{3, 0, 0, false});
  r.later_allocations = allocations() - mark;
  r.weights = params.gather_full_weights();
  return r;
}

// max |a - b| over max |b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= worst)) worst = d;  // NaN too
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return worst / std::max(scale, 1e-30);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Head size 32: the tensor-core attention under bf16 compute. 20 rows: head chunks of 8, 8 and 4.
const GptShape kShape{2, 2, 64, 16, 37, 0.1f};
constexpr int kB = 2, kT = 10;
constexpr int64_t kHeadChunk = 8;

std::unique_ptr<Backend> cpu() {
  auto be = std::move(*make_backend("cpu"));
  be->set_threads(1);
  return be;
}

}  // namespace

TEST_CASE("cuda_emu: the CUDA backend trains a whole GPT like the CPU (fp32 within 1e-4), allocating nothing",
          "[cuda_emu][backend]") {
  auto host = cpu();
  for (const char* ckpt : {"none", "selective"}) {
    CAPTURE(ckpt);
    CudaEmuBackend dev(0);  // fresh areas: only what prepare reserved
    Setup s;
    s.ckpt = ckpt;
    s.head_rows = kHeadChunk;
    const Run want = run(*host, kShape, kB, kT, s), got = run(dev, kShape, kB, kT, s);
    INFO("losses cpu " << want.losses[0] << ", " << want.losses[1] << " cuda " << got.losses[0] << ", " << got.losses[1]
                       << "; eval cpu " << want.eval << " cuda " << got.eval);
    CHECK(std::abs(got.losses[0] - want.losses[0]) <= 1e-4 * std::abs(want.losses[0]));
    CHECK(rel_diff(got.grads, want.grads) < 1e-4);
    // After AdamW steps: an update is about lr * sign(g) at first, so an element whose tiny gradient rounds to
    // the other sign moves by up to 2 lr a step: at most a few elements (0.1%) may differ by more than lr / 10,
    // none by more than 4 lr (a wrong optimizer moves them all).
    CHECK(std::abs(got.losses[1] - want.losses[1]) <= 1e-4 * std::abs(want.losses[1]));
    CHECK(std::abs(got.eval - want.eval) <= 1e-4 * std::abs(want.eval));
    REQUIRE(got.weights.size() == want.weights.size());
    double worst = 0.0;
    size_t apart = 0;
    for (size_t i = 0; i < got.weights.size(); ++i) {
      const double d = std::abs(double{got.weights[i]} - want.weights[i]);
      worst = std::max(worst, d);
      apart += d > kLr / 10;
    }
    INFO("weights: max difference " << worst << ", " << apart << " of " << got.weights.size() << " beyond lr/10");
    CHECK(worst <= 4 * kLr);
    CHECK(apart <= got.weights.size() / 1000);
    // Gpt::prepare reserved the backend's areas (ARCHITECTURE invariant 4); the optimizer's span tables and
    // scratch come in the first step, nothing after it.
    CHECK(got.first_allocations == 0);
    CHECK(got.later_allocations == 0);
  }
}

TEST_CASE(
    "cuda_emu: bf16 compute on the CUDA backend: bf16 GEMM inputs and bf16-only parameters change no bit, "
    "allocate nothing",
    "[cuda_emu][backend]") {
  // Without dropout the LayerNorm backwards also hand the projections their output gradient in bf16. zero2: the
  // parameters from publish()'s gathered bf16 copy; zero3: from each gathered unit.
  for (const auto& [ckpt, strategy, dropout] :
       {std::tuple{"none", Strategy::kSingle, 0.1f}, std::tuple{"selective", Strategy::kZero3, 0.1f},
        std::tuple{"none", Strategy::kSingle, 0.0f}, std::tuple{"full", Strategy::kZero2, 0.0f}}) {
    CAPTURE(ckpt, strategy_name(strategy), dropout);
    GptShape shape = kShape;
    shape.dropout = dropout;
    // The reference: fp32 GEMM inputs and parameters (the bf16 ones widened), the GEMMs' cast by the backend before
    // every GEMM (its cast areas grow).
    CudaEmuBackend ref(0);
    ref.set_compute_dtype(DType::kBF16);
    Setup cast{.ckpt = ckpt,
               .head_rows = kHeadChunk,
               .param = DType::kBF16,
               .gemm_inputs = DType::kF32,
               .widen = true,
               .strategy = strategy};
    const Run want = run(ref, shape, kB, kT, cast);
    CudaEmuBackend dev(0);  // fresh areas: only what prepare reserved
    dev.set_compute_dtype(DType::kBF16);
    Setup stored = cast;
    stored.gemm_inputs.reset();  // bf16, the compute dtype
    stored.widen = false;        // the parameters as ShardedParams holds them: bf16 only
    const Run got = run(dev, shape, kB, kT, stored);
    CHECK(same_bits(got.losses, want.losses));
    CHECK(got.eval == want.eval);
    CHECK(same_bits(got.grads, want.grads));
    CHECK(same_bits(got.weights, want.weights));
    // The cast areas reserve sized are enough (single's first forward/backward allocates nothing; zero3's gather
    // pools fill in it), and nothing is allocated after the first step.
    if (strategy == Strategy::kSingle) CHECK(got.first_allocations == 0);
    CHECK(got.later_allocations == 0);
  }
  // And it is bf16 arithmetic, close to fp32: the loss within 2% of the CPU's fp32 run.
  auto host = cpu();
  CudaEmuBackend dev(0);
  dev.set_compute_dtype(DType::kBF16);
  Setup plain;
  plain.head_rows = kHeadChunk;
  plain.param = DType::kBF16;
  const Run exact = run(*host, kShape, kB, kT, plain), lo = run(dev, kShape, kB, kT, plain);
  INFO("fp32 cpu " << exact.losses[0] << ", bf16 cuda " << lo.losses[0]);
  CHECK(lo.losses[0] != exact.losses[0]);
  CHECK(std::abs(lo.losses[0] - exact.losses[0]) <= 2e-2 * std::abs(exact.losses[0]));
  // The [cuda] parity test's bound for a bf16 step (GEMM, attention and the stored activations rounded): each
  // gradient tensor within 5e-2 of its largest element.
  const ModelLayout layout = ModelLayout::build(kShape);
  REQUIRE(lo.grads.size() == exact.grads.size());
  int64_t at = 0;
  for (const UnitLayout& u : layout.units) {
    for (const ParamSpec& p : u.params) {
      CAPTURE(u.name, p.name);
      const auto first = static_cast<std::ptrdiff_t>(at + p.offset);
      const std::vector<float> a(lo.grads.begin() + first, lo.grads.begin() + first + p.numel);
      const std::vector<float> b(exact.grads.begin() + first, exact.grads.begin() + first + p.numel);
      CHECK(rel_diff(a, b) < 5e-2);
    }
    at += u.numel;
  }
}

// A GEMM's bias held in bf16 (ShardedParams under bf16 compute) gives what its fp32 values give, bit for bit: for a
// bf16 output the epilogue takes it as it is when 16-byte aligned, else from a copy in the bias area; for an fp32
// output it is widened into that area (under fp32 compute too). An fp32 bias of a bf16 output is rounded there.
TEST_CASE("cuda_emu: matmul_forward takes a bf16 bias (aligned or not) as its fp32 values", "[cuda_emu][backend]") {
  const int64_t N = 5;
  const int C = 8, OC = 12;
  const CounterRng rng(8, 1);
  auto value = [&](uint64_t i) { return bf16_to_f32(f32_to_bf16(rng.uniform(i) * 2.0f - 1.0f)); };
  std::vector<float> inp(N * C), weight(OC * C), bias(OC);
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = value(i);
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = value(1000 + i);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = value(2000 + i);
  std::vector<bf16> bias_lo(OC + 8);  // the bias at element 0 (aligned) or 1 (2 bytes past 16-byte alignment)
  for (const DType compute : {DType::kBF16, DType::kF32}) {
    CudaEmuBackend dev(0);
    dev.set_compute_dtype(compute);
    auto upload = [&](const void* src, size_t bytes) {
      Buffer b = dev.alloc(bytes, MemCategory::kWorkspace);
      dev.to_device(b.data(), src, bytes);
      return b;
    };
    Buffer in = upload(inp.data(), inp.size() * 4), w = upload(weight.data(), weight.size() * 4);
    Buffer bf = upload(bias.data(), bias.size() * 4);
    for (const DType out_type : {DType::kF32, DType::kBF16}) {
      if (compute == DType::kF32 && out_type == DType::kBF16) continue;  // bf16 outputs need bf16 compute
      for (const int at : {0, 1}) {
        CAPTURE(dtype_name(compute), dtype_name(out_type), at);
        std::fill(bias_lo.begin(), bias_lo.end(), f32_to_bf16(NAN));
        for (int i = 0; i < OC; ++i) bias_lo[at + i] = f32_to_bf16(bias[i]);
        Buffer bl = upload(bias_lo.data(), bias_lo.size() * 2);
        const size_t out_bytes = N * OC * dtype_size(out_type);
        Buffer out[2] = {dev.alloc(out_bytes, MemCategory::kWorkspace), dev.alloc(out_bytes, MemCategory::kWorkspace)};
        dev.matmul_forward(TensorPtr(out[0].data(), out_type), in.as<float>(), w.as<float>(), bf.as<float>(), N, C, OC);
        dev.matmul_forward(TensorPtr(out[1].data(), out_type), in.as<float>(), w.as<float>(), bl.as<bf16>() + at, N, C,
                           OC);
        std::vector<unsigned char> h[2] = {std::vector<unsigned char>(out_bytes),
                                           std::vector<unsigned char>(out_bytes)};
        for (int k = 0; k < 2; ++k) dev.to_host(h[k].data(), out[k].data(), out_bytes);
        CHECK(h[1] == h[0]);
        if (out_type == DType::kF32) {  // and it is the product plus the bias
          std::vector<float> got(N * OC);
          std::memcpy(got.data(), h[1].data(), out_bytes);
          double worst = 0.0;
          for (int64_t n = 0; n < N; ++n) {
            for (int o = 0; o < OC; ++o) {
              double want = bias[o];
              for (int c = 0; c < C; ++c) want += double{inp[n * C + c]} * weight[o * C + c];
              worst = std::max(worst, std::abs(want - got[n * OC + o]));
            }
          }
          CHECK(worst < 1e-5);
        }
      }
    }
  }
}

// to_device lets its caller reuse the source at once, whatever its size: a restore reuses one host buffer for
// every region, a GPT-2-sized unit is over the 4 MiB staging slots, and CUDA does not promise that a copy from
// pageable memory has read it when cudaMemcpyAsync returns (the emulator reads it when the stream runs the copy).
// 18 MiB: five pieces, so the ring of four slots wraps within one upload; then small uploads reuse the slots. The
// downloads back: the large ones through the same slots too (to_host), each piece copied out only after its copy
// ran (the emulator runs a copy into pinned memory when something waits for it).
TEST_CASE("cuda_emu: to_device's source may be reused at once, a large upload too", "[cuda_emu][backend]") {
  CudaEmuBackend dev(0);
  const size_t big = (size_t{18} << 20) / sizeof(float) + 3, small = 1000;
  std::vector<float> host(big);
  Buffer d[3] = {dev.alloc(big * sizeof(float), MemCategory::kWorkspace),
                 dev.alloc(big * sizeof(float), MemCategory::kWorkspace),
                 dev.alloc(small * sizeof(float), MemCategory::kWorkspace)};
  for (int k = 0; k < 2; ++k) {  // the same host buffer for both uploads, rewritten at once
    for (size_t i = 0; i < big; ++i) host[i] = static_cast<float>(i % 1000003) + 0.25f * static_cast<float>(k);
    dev.to_device(d[k].data(), host.data(), big * sizeof(float));
  }
  for (size_t i = 0; i < small; ++i) host[i] = -static_cast<float>(i);
  dev.to_device(d[2].data(), host.data(), small * sizeof(float));
  std::fill(host.begin(), host.end(), NAN);
  for (int k = 0; k < 3; ++k) {
    const size_t n = k < 2 ? big : small;
    std::vector<float> got(n);
    dev.to_host(got.data(), d[k].data(), n * sizeof(float));
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const float want =
          k < 2 ? static_cast<float>(i % 1000003) + 0.25f * static_cast<float>(k) : -static_cast<float>(i);
      wrong += got[i] != want ? 1 : 0;
    }
    CAPTURE(k);
    CHECK(wrong == 0);
  }
}

// A GPU that allows a block less shared memory (sm_86 and sm_89: 99 KB) cannot launch the mma.sync attention at head
// size 128 (102 KB): auto takes the WMMA kernels there instead of failing at the launch (the emulator, like
// cudaFuncSetAttribute on such a GPU, ends the process at a launch past the limit); below what those need (77.5 KB),
// the fp32 kernels, also when wmma was asked for. The mma.sync and WMMA kernels give the same bits by design.
TEST_CASE("cuda_emu: attention takes the kernels that fit the GPU's shared memory per block", "[cuda_emu][backend]") {
  const int B = 1, T = 40, C = 256, NH = 2;  // head size 128
  const size_t nqkv = size_t{B} * T * 3 * C, nout = size_t{B} * T * C;
  const CounterRng rng(12, 3);
  std::vector<bf16> qkv(nqkv);
  std::vector<float> dout(nout);
  for (size_t i = 0; i < nqkv; ++i) qkv[i] = f32_to_bf16(rng.uniform(i) * 2.0f - 1.0f);
  for (size_t i = 0; i < nout; ++i) dout[i] = rng.uniform(100000 + i) * 2.0f - 1.0f;
  using Bits = std::vector<uint16_t>;
  // A fresh backend's forward output and input gradient, as bits.
  auto attend = [&](AttentionKernel kernel) {
    CudaEmuBackend dev(0);
    dev.set_compute_dtype(DType::kBF16);
    REQUIRE(dev.set_attention_kernel(kernel).is_ok());
    Buffer q = dev.alloc(nqkv * 2, MemCategory::kWorkspace), g = dev.alloc(nout * 4, MemCategory::kWorkspace);
    dev.to_device(q.data(), qkv.data(), nqkv * 2);
    dev.to_device(g.data(), dout.data(), nout * 4);
    Buffer o = dev.alloc(nout * 2, MemCategory::kWorkspace), dq = dev.alloc(nqkv * 2, MemCategory::kWorkspace);
    Buffer lse = dev.alloc(dev.attention_state_floats(B, T, NH) * 4, MemCategory::kWorkspace);
    const ConstTensorPtr in(q.data(), DType::kBF16), out_c(o.data(), DType::kBF16);
    dev.attention_forward(TensorPtr(o.data(), DType::kBF16), lse.as<float>(), in, B, T, C, NH, DropoutMask{});
    dev.attention_backward(TensorPtr(dq.data(), DType::kBF16), g.as<float>(), in, out_c, lse.as<float>(), B, T, C, NH,
                           DropoutMask{}, nullptr);
    std::pair<Bits, Bits> bits{Bits(nout), Bits(nqkv)};
    dev.to_host(bits.first.data(), o.data(), nout * 2);
    dev.to_host(bits.second.data(), dq.data(), nqkv * 2);
    return bits;
  };
  const auto mma = attend(AttentionKernel::kAuto), wmma = attend(AttentionKernel::kWmma);
  REQUIRE(mma == wmma);
  struct Restore {
    size_t bytes = emu_smem_per_block();
    ~Restore() { emu_smem_per_block() = bytes; }
  } restore;
  emu_smem_per_block() = 99 * 1024;
  CHECK(attend(AttentionKernel::kAuto) == wmma);
  emu_smem_per_block() = 76 * 1024;
  const auto fp32 = attend(AttentionKernel::kAuto);
  CHECK(fp32 != wmma);
  CHECK(fp32 != mma);
  CHECK(attend(AttentionKernel::kWmma) == fp32);
}

// A GPU older than the kernels' sm_80 (they would fail at the first launch with "no kernel image") is refused when
// the backend is made, naming the GPU, its compute capability and what to do.
TEST_CASE("cuda_emu: the CUDA backend refuses a GPU older than compute capability 8.0", "[cuda_emu][backend]") {
  struct Restore {
    std::pair<int, int> cc = emu_compute_capability();
    ~Restore() { emu_compute_capability() = cc; }
  } restore;
  emu_compute_capability() = {7, 5};
  auto old = make_cuda_emu_backend(0, 1);
  REQUIRE_FALSE(old.has_value());
  CHECK(old.status().message() ==
        "device 'cuda': GPU 0 (CUDA emulator) has compute capability 7.5; gpt-train's CUDA kernels need 8.0 or newer "
        "(A100, H100 and later): set run.device: cpu on this machine");
  emu_compute_capability() = {8, 0};
  CHECK(make_cuda_emu_backend(0, 1).has_value());
}

// GPT_GEMM_ALGO_CACHE's algorithm is the one checked and run: a file whose forward GEMM line holds an algorithm
// cuBLASLt refuses (the emulator's refuses an alignment of 0) ends the process at that GEMM's first call, naming the
// file, the shape and the way out.
TEST_CASE("cuda_emu: a GEMM algorithm from GPT_GEMM_ALGO_CACHE that cuBLASLt refuses stops the run",
          "[cuda_emu][backend]") {
  const testing::TempDir dir;
  const std::string path = dir.file("algos.txt");
  const int64_t N = 64;
  const int C = 32, OC = 48;
  auto forward = [&] {
    CudaEmuBackend dev(0);
    dev.set_compute_dtype(DType::kBF16);
    Buffer in = dev.alloc(N * C * 4, MemCategory::kActivations), w = dev.alloc(OC * C * 4, MemCategory::kParams);
    Buffer out = dev.alloc(N * OC * 4, MemCategory::kActivations);
    dev.fill_zero(static_cast<float*>(in.data()), N * C);
    dev.fill_zero(static_cast<float*>(w.data()), int64_t{OC} * C);
    dev.matmul_forward(static_cast<float*>(out.data()), static_cast<const float*>(in.data()),
                       static_cast<const float*>(w.data()), nullptr, N, C, OC);
    dev.synchronize();
  };
  const testing::ScopedEnv cache("GPT_GEMM_ALGO_CACHE", path.c_str());
  testing::ScopedEnv algos("GPT_GEMM_ALGOS", "2");
  forward();  // times the forward's shape and writes its line
  algos.set(nullptr);
  std::string text;
  REQUIRE(read_file(path, &text).is_ok());
  const size_t at = text.find(" algo ");
  REQUIRE(at != std::string::npos);
  text.replace(at + 6, 8, "00000000");  // the algorithm's first field: the alignment it was promised for A
  REQUIRE(write_file_atomically(path, {std::span<const char>(text.data(), text.size())}).is_ok());
  const auto [out, aborted] = emu_test::run_aborting(forward);
  INFO(out);
  CHECK(aborted);
  CHECK(out.find("GPT_GEMM_ALGO_CACHE " + path + ": cuBLASLt refuses its algorithm for the GEMM m 48 n 64 k 32 " +
                 "(delete the file to choose again)") != std::string::npos);
}

// A cudaMalloc the device cannot satisfy (the emulated device made small) ends the process with what it asked, what
// was free, what gpt-train held and what to change, not with cudaMalloc's bare "out of memory".
TEST_CASE("cuda_emu: the CUDA backend out of device memory says what it asked for and what to change",
          "[cuda_emu][backend]") {
  const auto [out, aborted] = emu_test::run_aborting([] {
    CudaEmuBackend dev(0);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != 0) return;
    emu_device_bytes = total - free + (size_t{1} << 20);  // 1 MiB left
    Buffer small = dev.alloc(size_t{512} << 10, MemCategory::kActivations);
    Buffer big = dev.alloc(size_t{3} << 20, MemCategory::kActivations);  // aborts
  });
  INFO(out);
  CHECK(aborted);
  CHECK(out.find("GPU 0 is out of memory: 3.0 MiB for activations did not fit in the 0.5 MiB free of ") !=
        std::string::npos);
  CHECK(out.find("parallel.device_memory_reserve_gb") != std::string::npos);
}

// Sampling on the CUDA backend: decode over the KV cache (the qkv GEMMs writing into it, the KV-cache attention
// kernel, the LM head on one row) against the CPU's decode, call by call, under fp32 compute, with the weights as
// the sampler holds them (InferenceWeights: uploaded once) and as ShardedParams does; under bf16 compute
// (parameters in bf16 only, as ShardedParams holds them) against the same backend's forward_logits, whose
// attention rounds P to bf16 for the tensor cores where decode's kernel does not.
TEST_CASE("cuda_emu: decode over a KV cache on the CUDA backend gives the CPU's logits", "[cuda_emu][backend]") {
  GptShape shape = kShape;
  shape.dropout = 0.0f;
  const CounterRng rng(6, 6);
  std::vector<int32_t> ids(shape.block_size);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(rng.u32(i) % shape.vocab_size);
  // (t0, n): a prompt of 6, then single tokens, then 4 at once up to the block size; then a window at t0 = 0.
  const std::vector<std::pair<int, int>> calls = {{0, 6}, {6, 1}, {7, 1}, {8, 4}, {12, 4}, {0, 16}};
  auto decoded = [&](Backend& be, DType param, bool inference_weights = false) {
    Gpt model(shape, be);
    auto single = make_single_communicator();
    ShardingOptions options;
    options.param_dtype = param;
    ShardedParams sharded(model.layout(), be, *single, Strategy::kSingle, nullptr, options);
    sharded.init(shape, 9);
    const std::vector<float> weights = sharded.gather_full_weights();
    InferenceWeights inference(model.layout(), be, weights);
    ParamSource& params = inference_weights ? static_cast<ParamSource&>(inference) : sharded;
    model.prepare_decode(shape.block_size);
    std::vector<std::vector<float>> logits;
    for (const auto& [t0, n] : calls) {
      const float* l = model.decode(params, ids.data() + t0, n, t0);
      logits.emplace_back(l, l + shape.vocab_size);
    }
    model.prepare(1, shape.block_size);
    const float* l = model.forward_logits(params, ids.data(), StepContext{3, 0, 0, false});
    logits.emplace_back(l + (shape.block_size - 1) * shape.vocab_size, l + shape.block_size * shape.vocab_size);
    return logits;
  };
  auto host = cpu();
  const auto want = decoded(*host, DType::kF32);
  for (const bool inference_weights : {true, false}) {
    CAPTURE(inference_weights);
    CudaEmuBackend dev(0);
    const auto got = decoded(dev, DType::kF32, inference_weights);
    for (size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(rel_diff(got[i], want[i]) < 1e-4);
    }
  }
  CudaEmuBackend lo_dev(0);
  lo_dev.set_compute_dtype(DType::kBF16);
  const auto lo = decoded(lo_dev, DType::kBF16);
  INFO("bf16 decode at 16 tokens against forward_logits: " << rel_diff(lo[4], lo.back()));
  CHECK(rel_diff(lo[4], lo.back()) < 1e-2);
  CHECK(rel_diff(lo[4], want[4]) < 5e-2);
}
