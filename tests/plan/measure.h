// Runs a Gpt, ShardedParams and AdamW as the Trainer does (init; optimizer steps of micro-batches with
// finish_grads, grad norm, AdamW and publish; eval forwards) in the same order as the planner's simulation
// (plan/memory_model.h: init, step, eval, step, eval, step, step), and returns this rank's peak bytes per memory
// category and the collectives' elements and bytes in the last step: the figures the planner predicts.
#pragma once

#include <array>
#include <catch2/catch.hpp>
#include <vector>

#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "parallel/sharded_params.h"
#include "plan/planner.h"

namespace gpt::testing {

struct Measured {
  std::array<int64_t, kNumMemCategories> bytes{};  // peak minus what was allocated before
  std::array<int64_t, kNumCommOps> step_elements{}, step_bytes{};

  int64_t at(MemCategory c) const { return bytes[static_cast<size_t>(c)]; }
  int64_t at(CommOp op) const { return step_elements[static_cast<size_t>(op)]; }
  int64_t bytes_of(CommOp op) const { return step_bytes[static_cast<size_t>(op)]; }
};

// `group` shards; `replicas` (hybrid) all-reduces gradient shards across groups, or null. `bf16_compute`: the CPU
// backend computes in bf16, as a GPU does under param_dtype bf16 (ShardedParams then holds bf16-only parameters).
inline Measured run_and_measure(const PlanInput& in, Strategy strategy, Communicator& group,
                                Communicator* replicas = nullptr, bool bf16_compute = false) {
  const int B = in.micro_batch, T = in.shape.block_size, V = in.shape.vocab_size;
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  const CounterRng rng(3, 4);
  for (size_t i = 0; i < inputs.size(); ++i) {
    inputs[i] = static_cast<int32_t>(rng.u32(2 * i) % V);
    targets[i] = static_cast<int32_t>(rng.u32(2 * i + 1) % V);
  }
  auto comm_stats = [&] {
    CommStats total = group.stats();
    if (replicas != nullptr) {
      const CommStats r = replicas->stats();
      for (size_t op = 0; op < kNumCommOps; ++op) {
        total.ops[op].elements += r.ops[op].elements;
        total.ops[op].bytes += r.ops[op].bytes;
      }
    }
    return total;
  };
  const MemStats before = MemTracker::instance().stats();
  MemTracker::instance().reset_peaks();
  Measured m;
  auto backend = std::move(*make_backend("cpu"));
  backend->set_threads(1);
  if (bf16_compute) backend->set_compute_dtype(DType::kBF16);
  Gpt model(in.shape, *backend, *ActivationCheckpointing::parse(in.activation_checkpointing));
  model.prepare(B, T, static_cast<int>(in.micro_batches_per_step));
  ShardedParams params(model.layout(), *backend, group, strategy, replicas, in.sharding);
  params.init(in.shape, 1);
  AdamW opt(*backend, model.layout(), params.regions(), params.local_numel(), AdamWConfig{});
  auto step = [&](int64_t s) {
    for (int64_t micro = 0; micro < in.micro_batches_per_step; ++micro) {
      params.begin_micro_batch(micro == 0, micro + 1 == in.micro_batches_per_step);
      model.forward_backward_into(params, inputs.data(), targets.data(), 1e-3f, StepContext{1, s, 0, true},
                                  static_cast<int>(micro));
    }
    (void)model.mean_losses(static_cast<int>(in.micro_batches_per_step));
    params.finish_grads();
    (void)params.grad_sq_norm();
    opt.step(params.master(), params.local_grads(), 1e-3f, 1.0f, params.master_lo(),
             params.rounding(opt.steps_taken() + 1));
    params.publish(opt.steps_taken(), /*lo_written=*/true);
  };
  auto eval = [&] { (void)model.forward_loss(params, inputs.data(), targets.data(), StepContext{1, 0, 0, false}); };
  step(0);
  eval();
  step(1);
  eval();
  step(2);
  const CommStats c0 = comm_stats();
  step(3);
  const CommStats c1 = comm_stats();
  for (size_t op = 0; op < kNumCommOps; ++op) {
    m.step_elements[op] = c1.ops[op].elements - c0.ops[op].elements;
    m.step_bytes[op] = c1.ops[op].bytes - c0.ops[op].bytes;
  }
  const MemStats after = MemTracker::instance().stats();
  for (size_t c = 0; c < kNumMemCategories; ++c) m.bytes[c] = after.peak[c] - before.current[c];
  return m;
}

// Every category and the collective volume of one step as the plan says; `extra_all_reduce` elements are
// scalar all-reduces (the grad norm) that the plan leaves out.
inline void check_matches_plan(const Measured& m, const StrategyPlan& p, int64_t extra_all_reduce = 0) {
  CHECK(m.at(MemCategory::kParams) == p.params);
  CHECK(m.at(MemCategory::kGrads) == p.grads);
  CHECK(m.at(MemCategory::kMaster) == p.master);
  CHECK(m.at(MemCategory::kOptimizer) == p.optimizer);
  CHECK(m.at(MemCategory::kActivations) == p.activations);
  CHECK(m.at(MemCategory::kWorkspace) == p.workspace);
  CHECK(m.at(MemCategory::kComm) == p.comm_buffers);
  CHECK(m.at(CommOp::kAllReduce) == p.comm_elements_per_step.all_reduce + extra_all_reduce);
  CHECK(m.at(CommOp::kReduceScatter) == p.comm_elements_per_step.reduce_scatter);
  CHECK(m.at(CommOp::kAllGather) == p.comm_elements_per_step.all_gather);
}

}  // namespace gpt::testing
