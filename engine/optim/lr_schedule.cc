#include "optim/lr_schedule.h"

#include <cmath>

namespace gpt {

float LrSchedule::at(int64_t step) const {
  if (kind == Kind::kConstant) return lr;
  // warmup_steps + 1 in float: in int64 it would overflow at its largest value (the same float below 2^24).
  if (step < warmup_steps) return lr * static_cast<float>(step + 1) / (static_cast<float>(warmup_steps) + 1.0f);
  if (step >= decay_steps) return min_lr;
  const double ratio = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps - warmup_steps);
  const double coeff = kind == Kind::kCosine ? 0.5 * (1.0 + std::cos(M_PI * ratio)) : 1.0 - ratio;
  return static_cast<float>(min_lr + coeff * (lr - min_lr));
}

}  // namespace gpt
