// Every strategy's code path as a device backend sees it, without a GPU: on FakeDeviceBackend (parallel/fake_device.h),
// whose pointers host code cannot dereference, and FakeDeviceCommunicator standing in for NCCL. Any host-side read or
// write of backend memory in the model, ShardedParams or AdamW crashes this test, and the results must equal the
// plain CPU backend's bit for bit.
#include "parallel/fake_device.h"

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

using testing::FakeDeviceBackend;
using testing::FakeDeviceCommunicator;

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
