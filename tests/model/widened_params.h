// WidenedParams: a ParamSource that forwards to another but hands out bf16 parameters widened to fp32 (its own
// copy per unit), so every op computes from fp32 parameters and bf16 GEMMs round the weights themselves: the
// reference that a source holding bf16 parameters only must equal bit for bit.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace gpt::testing {

class WidenedParams final : public ParamSource {
 public:
  WidenedParams(ParamSource& inner, Backend& backend, const ModelLayout& layout)
      : inner_(inner), be_(backend), layout_(layout), copies_(layout.units.size()) {}
  ConstTensorPtr acquire(int unit) override {
    const ConstTensorPtr p = inner_.acquire(unit);
    if (!p.is_bf16()) return p;
    const int64_t n = layout_.units[unit].numel;
    Buffer& copy = copies_[unit];
    if (copy.empty()) copy = be_.alloc(static_cast<size_t>(n) * sizeof(float), MemCategory::kWorkspace);
    be_.cast_from_bf16(copy.as<float>(), p.as_bf16(), n);
    return copy.as<float>();
  }
  void release(int unit) override { inner_.release(unit); }
  float* grads(int unit) override { return inner_.grads(unit); }
  void grads_done(int unit) override { inner_.grads_done(unit); }

 private:
  ParamSource& inner_;
  Backend& be_;
  const ModelLayout& layout_;
  std::vector<Buffer> copies_;
};

}  // namespace gpt::testing
