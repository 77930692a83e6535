// Learning-rate schedules: linear warmup from lr/(warmup+1) to lr over `warmup_steps`, then cosine or
// linear decay to min_lr at `decay_steps`, min_lr after; or constant. The same formula as nanoGPT.
#pragma once

#include <cstdint>
#include <string>

namespace gpt {

struct LrSchedule {
  enum class Kind { kCosine, kLinear, kConstant };
  Kind kind = Kind::kCosine;
  float lr = 1e-3f;
  float min_lr = 1e-4f;
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;

  // `step` is 0-based: the learning rate used by the (step+1)-th optimizer step.
  float at(int64_t step) const;
};

}  // namespace gpt
