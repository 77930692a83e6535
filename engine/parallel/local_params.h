// LocalParams: the single-process ParamSource. It holds every unit's fp32 parameters (which are also the
// master weights under the fp32 policy) and gradients in two contiguous flat buffers, unit after unit in
// layout order, so the optimizer and checkpoints see one flat model buffer. acquire/release are free.
// The sharded strategies of issue 3 implement the same interface over shards.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "core/allocator.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace gpt {

class LocalParams final : public ParamSource {
 public:
  LocalParams(const ModelLayout& layout, Backend& backend);

  const float* acquire(int unit) override { return params_.as<float>() + unit_offset_[unit]; }
  void release(int) override {}
  float* grads(int unit) override { return grads_.as<float>() + unit_offset_[unit]; }
  void grads_done(int) override {}

  // GPT-2 init of every unit from the counter-based RNG.
  void init(const GptShape& shape, uint64_t seed);
  void zero_grads();

  float* params() { return params_.as<float>(); }
  const float* params() const { return params_.as<float>(); }
  const float* all_grads() const { return grads_.as<float>(); }
  int64_t numel() const { return numel_; }
  int64_t unit_offset(int unit) const { return unit_offset_[unit]; }

 private:
  const ModelLayout& layout_;
  Backend& be_;
  std::vector<int64_t> unit_offset_;
  int64_t numel_ = 0;
  Buffer params_;
  Buffer grads_;
};

}  // namespace gpt
