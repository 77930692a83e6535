// Every strategy's code path as a device backend sees it, without a GPU: FakeDeviceBackend computes on the CPU
// but hands out pointers that host code cannot dereference (the real address plus 2^47, which is not a
// canonical x86-64 address, so any load or store through it faults at once). It translates them back inside
// its own ops, as a GPU's kernels would use device memory; host_memory() is false. A communicator wrapper does
// the same for collectives, standing in for NCCL. Any host-side read or write of backend memory in the model,
// ShardedParams or AdamW crashes this test, and the results must equal the plain CPU backend's bit for bit.
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "parallel/sharded_params.h"

namespace gpt {
namespace {

constexpr uintptr_t kShift = uintptr_t{1} << 47;

template <typename T>
T* real(T* p) {
  return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) - kShift);
}
template <typename T>
T* fake(T* p) {
  return p == nullptr ? nullptr : reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + kShift);
}

template <typename V>
BasicTensorPtr<V> real(BasicTensorPtr<V> p) {
  return {real(p.data), p.dtype};
}

void free_fake(void* p) { std::free(real(p)); }

class FakeDeviceBackend final : public Backend {
 public:
  FakeDeviceBackend() : cpu_(std::move(*make_backend("cpu"))) { cpu_->set_threads(1); }
  std::string_view name() const override { return "fake-device"; }
  Buffer alloc(size_t bytes, MemCategory category) override {
    if (bytes == 0) return Buffer();
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    REQUIRE(p != nullptr);
    REQUIRE(reinterpret_cast<uintptr_t>(p) < kShift);
    std::memset(p, 0, bytes);
    return Buffer::adopt(fake(p), bytes, category, free_fake);
  }
  void set_threads(int) override {}
  bool host_memory() const override { return false; }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(real(dst), src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, real(src), bytes); }
  void set_compute_dtype(DType type) override { cpu_->set_compute_dtype(type); }
  DType compute_dtype() const override { return cpu_->compute_dtype(); }

  void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B, int T,
                         int C) override {
    cpu_->embedding_forward(real(out), real(tokens), real(wte), real(wpe), B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) override {
    cpu_->embedding_backward(real(dwte), real(dwpe), real(dout), real(tokens), B, T, C);
  }
  void matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                      int OC) override {
    cpu_->matmul_forward(real(out), real(inp), real(weight), real(bias), N, C, OC);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                       ConstTensorPtr weight, int64_t N, int C, int OC) override {
    cpu_->matmul_backward(real(dinp), real(dweight), real(dbias), real(dout), real(inp), real(weight), N, C, OC);
  }
  void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                         ConstTensorPtr bias, int64_t N, int C) override {
    cpu_->layernorm_forward(real(out), real(mean), real(rstd), real(inp), real(weight), real(bias), N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                          bf16* dinp_lo) override {
    cpu_->layernorm_backward(real(dinp), real(dweight), real(dbias), real(dout), real(inp), real(weight), real(mean),
                             real(rstd), N, C, real(dinp_lo));
  }
  void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                  const float* inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                                  const DropoutMask& drop) override {
    cpu_->residual_layernorm_forward(real(res_out), real(out), real(mean), real(rstd), real(res), real(inp),
                                     real(weight), real(bias), N, C, drop);
  }
  int64_t attention_state_floats(int B, int T, int NH) const override { return cpu_->attention_state_floats(B, T, NH); }
  void attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                         const DropoutMask& drop) override {
    cpu_->attention_forward(real(out), real(att), real(qkv), B, T, C, NH, drop);
  }
  void attention_backward(TensorPtr dqkv, const float* dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* att,
                          int B, int T, int C, int NH, const DropoutMask& drop) override {
    cpu_->attention_backward(real(dqkv), real(dout), real(qkv), real(out), real(att), B, T, C, NH, drop);
  }
  void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) override {
    cpu_->gelu_forward(real(out), real(inp), N);
  }
  void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, const float* dout, int64_t N) override {
    cpu_->gelu_backward(real(dinp), real(inp), real(dout), N);
  }
  void residual_forward(float* out, const float* res, const float* inp, int64_t N, const DropoutMask& drop) override {
    cpu_->residual_forward(real(out), real(res), real(inp), N, drop);
  }
  void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) override {
    cpu_->dropout_backward(real(dinp), real(dout), N, drop);
  }
  void dropout_forward(float* x, int64_t N, const DropoutMask& drop) override {
    cpu_->dropout_forward(real(x), N, drop);
  }
  void crossentropy_forward_backward(float* losses, TensorPtr dlogits, const float* logits, const int32_t* targets,
                                     int64_t N, int V, int Vp, float dloss) override {
    cpu_->crossentropy_forward_backward(real(losses), real(dlogits), real(logits), real(targets), N, V, Vp, dloss);
  }
  void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale, int64_t step) override {
    cpu_->adamw_update(real(param), real(m), real(v), real(grad), n, lr, beta1, beta2, eps, weight_decay, grad_scale,
                       step);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu_->sum_squares(real(x), n); }
  void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                          const std::vector<OptimSpan>& spans, const AdamWStep& step,
                          const Bf16Rounding& rounding) override {
    cpu_->adamw_update_spans(real(param), real(m), real(v), real(grad), real(param_lo), spans, step, rounding);
  }
  double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) override {
    return cpu_->sum_squares_spans(real(x), spans);
  }
  void round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                           const Bf16Rounding& rounding) override {
    cpu_->round_to_bf16_spans(real(dst), real(src), spans, rounding);
  }
  void fill_zero(float* x, int64_t n) override { cpu_->fill_zero(real(x), n); }
  void cast_to_bf16(bf16* dst, const float* src, int64_t n) override { cpu_->cast_to_bf16(real(dst), real(src), n); }
  void cast_from_bf16(float* dst, const bf16* src, int64_t n) override {
    cpu_->cast_from_bf16(real(dst), real(src), n);
  }
  void copy(float* dst, const float* src, int64_t n) override { cpu_->copy(real(dst), real(src), n); }

 private:
  std::unique_ptr<Backend> cpu_;
};

// The device communicator's stand-in: the same collectives on the translated pointers.
class FakeDeviceCommunicator final : public Communicator {
 public:
  explicit FakeDeviceCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string_view group_name() const override { return inner_.group_name(); }
  Work all_reduce(void* buf, int64_t n, DType dtype) override { return inner_.all_reduce(real(buf), n, dtype); }
  Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    return inner_.reduce_scatter(real(send), real(recv), n, dtype);
  }
  Work all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    return inner_.all_gather(real(send), real(recv), n, dtype);
  }
  Work broadcast(void* buf, int64_t n, DType dtype, int root) override {
    return inner_.broadcast(real(buf), n, dtype, root);
  }
  Work barrier() override { return inner_.barrier(); }
  std::unique_ptr<Communicator> split(int, int, std::string) override { return nullptr; }
  CommStats stats() const override { return inner_.stats(); }

 private:
  Communicator& inner_;
};

struct Outcome {
  std::vector<float> losses;
  std::vector<float> weights;
};

// Three optimizer steps of two micro-batches each, as the trainer runs them.
Outcome train(Backend& be, Communicator& group, Communicator& host_group, Strategy strategy, ShardingOptions options) {
  const GptShape shape{2, 2, 16, 8, 23, 0.1f};
  Gpt model(shape, be, *ActivationCheckpointing::parse("selective"));
  ShardedParams params(model.layout(), be, group, strategy, nullptr, options, &host_group);
  params.init(shape, 7);
  AdamW opt(be, model.layout(), params.regions(), params.local_numel(), AdamWConfig{0.9f, 0.95f, 1e-8f, 0.1f});
  const int B = 2, T = 8;
  model.prepare(B, T);
  Outcome out;
  CounterRng rng(3, 3);
  for (int step = 0; step < 3; ++step) {
    for (int micro = 0; micro < 2; ++micro) {
      std::vector<int32_t> inputs(B * T), targets(B * T);
      for (int i = 0; i < B * T; ++i) {
        inputs[i] = static_cast<int32_t>(rng.u32((step * 2 + micro) * 1000 + i) % 23);
        targets[i] = static_cast<int32_t>(rng.u32((step * 2 + micro) * 1000 + 500 + i) % 23);
      }
      params.begin_micro_batch(micro == 0, micro == 1);
      const StepContext ctx{5, step, micro * B, true};
      out.losses.push_back(model.forward_backward(params, inputs.data(), targets.data(), 1.0f / (2 * B * T), ctx));
    }
    params.finish_grads();
    const double norm = std::sqrt(params.grad_sq_norm());
    opt.step(params.master(), params.local_grads(), 1e-2f, norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.0f,
             params.master_lo(), params.rounding(opt.steps_taken() + 1));
    params.publish(opt.steps_taken(), /*lo_written=*/true);
    out.losses.push_back(static_cast<float>(norm));
  }
  out.weights = params.gather_full_weights();
  return out;
}

TEST_CASE("Every strategy's device path touches backend memory only through the backend", "[parallel]") {
  struct Variant {
    Strategy strategy;
    DType param, reduce;
    int prefetch;
    // bf16: the model stores its GEMM inputs in bf16 and, under param_dtype bf16, ShardedParams holds bf16-only
    // parameters (what a GPU run under bf16 does)
    DType compute = DType::kF32;
  };
  for (const Variant v :
       {Variant{Strategy::kSingle, DType::kF32, DType::kF32, 0}, Variant{Strategy::kDdp, DType::kF32, DType::kF32, 0},
        Variant{Strategy::kDdp, DType::kBF16, DType::kBF16, 0}, Variant{Strategy::kZero1, DType::kF32, DType::kBF16, 0},
        Variant{Strategy::kZero2, DType::kF32, DType::kF32, 0}, Variant{Strategy::kZero3, DType::kF32, DType::kF32, 1},
        Variant{Strategy::kZero3, DType::kBF16, DType::kBF16, 2},
        Variant{Strategy::kSingle, DType::kBF16, DType::kF32, 0, DType::kBF16},
        Variant{Strategy::kDdp, DType::kBF16, DType::kBF16, 0, DType::kBF16},
        Variant{Strategy::kZero1, DType::kBF16, DType::kF32, 0, DType::kBF16},
        Variant{Strategy::kZero2, DType::kBF16, DType::kBF16, 0, DType::kBF16},
        Variant{Strategy::kZero3, DType::kBF16, DType::kBF16, 1, DType::kBF16}}) {
    CAPTURE(strategy_name(v.strategy), dtype_name(v.param), dtype_name(v.reduce), v.prefetch, dtype_name(v.compute));
    ShardingOptions options;
    options.param_dtype = v.param;
    options.reduce_dtype = v.reduce;
    options.prefetch = v.prefetch;
    options.bucket_bytes = 512;  // several ddp buckets
    auto cpu = std::move(*make_backend("cpu"));
    cpu->set_threads(1);
    cpu->set_compute_dtype(v.compute);
    auto world = make_single_communicator();
    const Outcome want = train(*cpu, *world, *world, v.strategy, options);
    FakeDeviceBackend dev;
    dev.set_compute_dtype(v.compute);
    auto dev_world = make_single_communicator();
    FakeDeviceCommunicator dev_group(*dev_world);
    const Outcome got = train(dev, dev_group, *dev_world, v.strategy, options);
    REQUIRE(got.losses == want.losses);
    REQUIRE(got.weights == want.weights);
  }
}

}  // namespace
}  // namespace gpt
