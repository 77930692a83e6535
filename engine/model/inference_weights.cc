#include "model/inference_weights.h"

#include "core/check.h"

namespace gpt {

InferenceWeights::InferenceWeights(const ModelLayout& layout, Backend& backend, const std::vector<float>& weights) {
  int64_t at = 0;
  for (const UnitLayout& u : layout.units) {
    offsets_.push_back(at);
    at += u.numel;
  }
  GPT_CHECK_MSG(at == static_cast<int64_t>(weights.size()), "InferenceWeights: the weights do not fit the layout");
  if (backend.host_memory()) {
    base_ = weights.data();
    return;
  }
  device_ = backend.alloc(weights.size() * sizeof(float), MemCategory::kParams);
  backend.to_device(device_.data(), weights.data(), weights.size() * sizeof(float));
  base_ = device_.as<float>();
}

ConstTensorPtr InferenceWeights::acquire(int unit) { return ConstTensorPtr(base_ + offsets_[unit]); }

float* InferenceWeights::grads(int /*unit*/) {
  GPT_CHECK_MSG(false, "InferenceWeights: no gradients (inference only)");
  return nullptr;
}

}  // namespace gpt
