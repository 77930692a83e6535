// WithoutBf16Copies: a ParamSource that forwards to another but keeps its bf16 copies to itself
// (acquired_bf16 returns null), so bf16 GEMMs cast the fp32 weights themselves: the reference the bf16-copy
// path must equal bit for bit.
#pragma once

#include "model/param_source.h"

namespace gpt::testing {

class WithoutBf16Copies final : public ParamSource {
 public:
  explicit WithoutBf16Copies(ParamSource& inner) : inner_(inner) {}
  const float* acquire(int unit) override { return inner_.acquire(unit); }
  void release(int unit) override { inner_.release(unit); }
  float* grads(int unit) override { return inner_.grads(unit); }
  void grads_done(int unit) override { inner_.grads_done(unit); }

 private:
  ParamSource& inner_;
};

}  // namespace gpt::testing
