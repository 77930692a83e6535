// InferenceWeights: a ParamSource for inference (sampling): the whole model's weights in one buffer, unit after
// unit in layout order, as load_model returns them. No gradients and no sharding, so no second copy of the model:
// on a backend with host memory the caller's vector is read in place; on a device it is uploaded once.
#pragma once

#include <vector>

#include "core/allocator.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace gpt {

class InferenceWeights final : public ParamSource {
 public:
  // REQUIRES: weights.size() is the layout's total numel; `weights` outlives this on a host-memory backend.
  InferenceWeights(const ModelLayout& layout, Backend& backend, const std::vector<float>& weights);
  ConstTensorPtr acquire(int unit) override;
  void release(int /*unit*/) override {}
  float* grads(int unit) override;  // never: inference has no backward (a CHECK failure)
  void grads_done(int /*unit*/) override {}

 private:
  const float* base_ = nullptr;
  Buffer device_;
  std::vector<int64_t> offsets_;
};

}  // namespace gpt
