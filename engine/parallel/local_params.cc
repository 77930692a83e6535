#include "parallel/local_params.h"

namespace gpt {

LocalParams::LocalParams(const ModelLayout& layout, Backend& backend) : layout_(layout), be_(backend) {
  for (const auto& u : layout.units) {
    unit_offset_.push_back(numel_);
    numel_ += u.numel;
  }
  params_ = be_.alloc(numel_ * sizeof(float), MemCategory::kParams);
  grads_ = be_.alloc(numel_ * sizeof(float), MemCategory::kGrads);
}

void LocalParams::init(const GptShape& shape, uint64_t seed) {
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    init_unit_slice(layout_.units[u], shape, seed, 0, layout_.units[u].numel, params() + unit_offset_[u]);
  }
}

void LocalParams::zero_grads() { be_.fill_zero(grads_.as<float>(), numel_); }

}  // namespace gpt
