// FakeDeviceBackend: a device backend without a GPU. It computes on the CPU but hands out pointers that host code
// cannot dereference (the real address plus 2^47, which is not a canonical x86-64 address, so any load or store
// through it faults at once), and translates them back inside its own ops, as a GPU's kernels would use device
// memory; host_memory() is false. FakeDeviceCommunicator does the same for collectives, standing in for NCCL.
// Whatever runs on them (the model, ShardedParams, AdamW, the Trainer) crashes on any host-side read or write of
// backend memory, and computes what the plain CPU backend computes, bit for bit.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"

namespace gpt::testing {
namespace fake_device {

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

inline void free_fake(void* p) { std::free(real(p)); }

}  // namespace fake_device

class FakeDeviceBackend final : public Backend {
 public:
  FakeDeviceBackend() : cpu_(std::move(*make_backend("cpu"))) { cpu_->set_threads(1); }
  std::string_view name() const override { return "fake-device"; }
  Buffer alloc(size_t bytes, MemCategory category) override {
    if (bytes == 0) return Buffer();
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    REQUIRE(p != nullptr);
    REQUIRE(reinterpret_cast<uintptr_t>(p) < fake_device::kShift);
    std::memset(p, 0, bytes);
    return Buffer::adopt(fake_device::fake(p), bytes, category, fake_device::free_fake);
  }
  void set_threads(int) override {}
  bool host_memory() const override { return false; }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(fake_device::real(dst), src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, fake_device::real(src), bytes); }
  void set_compute_dtype(DType type) override { cpu_->set_compute_dtype(type); }
  DType compute_dtype() const override { return cpu_->compute_dtype(); }

  void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B, int T,
                         int C) override {
    cpu_->embedding_forward(fake_device::real(out), fake_device::real(tokens), fake_device::real(wte),
                            fake_device::real(wpe), B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) override {
    cpu_->embedding_backward(fake_device::real(dwte), fake_device::real(dwpe), fake_device::real(dout),
                             fake_device::real(tokens), B, T, C);
  }
  using Backend::matmul_backward;
  using Backend::matmul_forward;
  void matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                      int OC, int64_t ld_out) override {
    cpu_->matmul_forward(fake_device::real(out), fake_device::real(inp), fake_device::real(weight),
                         fake_device::real(bias), N, C, OC, ld_out);
  }
  void matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                       ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) override {
    cpu_->matmul_backward(fake_device::real(dinp), fake_device::real(dweight), fake_device::real(dbias),
                          fake_device::real(dout), fake_device::real(inp), fake_device::real(weight), N, C, OC,
                          ld_dout);
  }
  void bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) override {
    cpu_->bias_backward(fake_device::real(dbias), fake_device::real(dout), N, OC);
  }
  void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                         ConstTensorPtr bias, int64_t N, int C) override {
    cpu_->layernorm_forward(fake_device::real(out), fake_device::real(mean), fake_device::real(rstd),
                            fake_device::real(inp), fake_device::real(weight), fake_device::real(bias), N, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                          ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                          bf16* dinp_lo) override {
    cpu_->layernorm_backward(fake_device::real(dinp), fake_device::real(dweight), fake_device::real(dbias),
                             fake_device::real(dout), fake_device::real(inp), fake_device::real(weight),
                             fake_device::real(mean), fake_device::real(rstd), N, C, fake_device::real(dinp_lo));
  }
  void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                  ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                                  const DropoutMask& drop) override {
    cpu_->residual_layernorm_forward(fake_device::real(res_out), fake_device::real(out), fake_device::real(mean),
                                     fake_device::real(rstd), fake_device::real(res), fake_device::real(inp),
                                     fake_device::real(weight), fake_device::real(bias), N, C, drop);
  }
  int64_t attention_state_floats(int B, int T, int NH) const override { return cpu_->attention_state_floats(B, T, NH); }
  void attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                         const DropoutMask& drop) override {
    cpu_->attention_forward(fake_device::real(out), fake_device::real(att), fake_device::real(qkv), B, T, C, NH, drop);
  }
  void attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* att,
                          int B, int T, int C, int NH, const DropoutMask& drop, float* dqkv_bias) override {
    cpu_->attention_backward(fake_device::real(dqkv), fake_device::real(dout), fake_device::real(qkv),
                             fake_device::real(out), fake_device::real(att), B, T, C, NH, drop,
                             fake_device::real(dqkv_bias));
  }
  void attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) override {
    cpu_->attention_forward_rows(fake_device::real(out), fake_device::real(qkv), T, t0, C, NH);
  }
  void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) override {
    cpu_->gelu_forward(fake_device::real(out), fake_device::real(inp), N);
  }
  void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) override {
    cpu_->gelu_backward(fake_device::real(dinp), fake_device::real(inp), fake_device::real(dout), N);
  }
  void residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N, const DropoutMask& drop) override {
    cpu_->residual_forward(fake_device::real(out), fake_device::real(res), fake_device::real(inp), N, drop);
  }
  void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) override {
    cpu_->dropout_backward(fake_device::real(dinp), fake_device::real(dout), N, drop);
  }
  void dropout_forward(float* x, int64_t N, const DropoutMask& drop) override {
    cpu_->dropout_forward(fake_device::real(x), N, drop);
  }
  void crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits, const int32_t* targets,
                                     int64_t N, int V, int Vp, float dloss) override {
    cpu_->crossentropy_forward_backward(fake_device::real(losses), fake_device::real(dlogits),
                                        fake_device::real(logits), fake_device::real(targets), N, V, Vp, dloss);
  }
  void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale, int64_t step) override {
    cpu_->adamw_update(fake_device::real(param), fake_device::real(m), fake_device::real(v), fake_device::real(grad), n,
                       lr, beta1, beta2, eps, weight_decay, grad_scale, step);
  }
  double sum_squares(const float* x, int64_t n) override { return cpu_->sum_squares(fake_device::real(x), n); }
  void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                          const std::vector<OptimSpan>& spans, const AdamWStep& step,
                          const Bf16Rounding& rounding) override {
    cpu_->adamw_update_spans(fake_device::real(param), fake_device::real(m), fake_device::real(v),
                             fake_device::real(grad), fake_device::real(param_lo), spans, step, rounding);
  }
  double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) override {
    return cpu_->sum_squares_spans(fake_device::real(x), spans);
  }
  void round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                           const Bf16Rounding& rounding) override {
    cpu_->round_to_bf16_spans(fake_device::real(dst), fake_device::real(src), spans, rounding);
  }
  void fill_zero(float* x, int64_t n) override { cpu_->fill_zero(fake_device::real(x), n); }
  void cast_to_bf16(bf16* dst, const float* src, int64_t n) override {
    cpu_->cast_to_bf16(fake_device::real(dst), fake_device::real(src), n);
  }
  void cast_from_bf16(float* dst, const bf16* src, int64_t n) override {
    cpu_->cast_from_bf16(fake_device::real(dst), fake_device::real(src), n);
  }
  void copy(float* dst, const float* src, int64_t n) override {
    cpu_->copy(fake_device::real(dst), fake_device::real(src), n);
  }

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
  Work all_reduce(void* buf, int64_t n, DType dtype) override {
    return inner_.all_reduce(fake_device::real(buf), n, dtype);
  }
  Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    return inner_.reduce_scatter(fake_device::real(send), fake_device::real(recv), n, dtype);
  }
  Work all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    return inner_.all_gather(fake_device::real(send), fake_device::real(recv), n, dtype);
  }
  Work broadcast(void* buf, int64_t n, DType dtype, int root) override {
    return inner_.broadcast(fake_device::real(buf), n, dtype, root);
  }
  Work barrier() override { return inner_.barrier(); }
  std::unique_ptr<Communicator> split(int, int, std::string) override { return nullptr; }
  CommStats stats() const override { return inner_.stats(); }

 private:
  Communicator& inner_;
};

}  // namespace gpt::testing
