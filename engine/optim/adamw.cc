#include "optim/adamw.h"

#include <algorithm>

namespace gpt {

AdamW::AdamW(Backend& backend, const ModelLayout& layout, int64_t begin, int64_t end, AdamWConfig config)
    : be_(backend), config_(config), begin_(begin), end_(end) {
  int64_t unit_base = 0;
  for (const auto& u : layout.units) {
    for (const auto& p : u.params) {
      const int64_t lo = std::max(begin, unit_base + p.offset);
      const int64_t hi = std::min(end, unit_base + p.offset + p.numel);
      if (lo >= hi) continue;
      // Merge with the previous range when contiguous and of the same kind: fewer kernel calls.
      if (!ranges_.empty() && ranges_.back().decay == p.weight_decay &&
          ranges_.back().begin + ranges_.back().length == lo - begin) {
        ranges_.back().length += hi - lo;
      } else {
        ranges_.push_back({lo - begin, hi - lo, p.weight_decay});
      }
    }
    unit_base += u.numel;
  }
  m_ = be_.alloc((end - begin) * sizeof(float), MemCategory::kOptimizer);
  v_ = be_.alloc((end - begin) * sizeof(float), MemCategory::kOptimizer);
}

void AdamW::step(float* master, const float* grads, float lr, float grad_scale) {
  ++t_;
  for (const Range& r : ranges_) {
    be_.adamw_update(master + r.begin, m() + r.begin, v() + r.begin, grads + r.begin, r.length, lr, config_.beta1,
                     config_.beta2, config_.eps, r.decay ? config_.weight_decay : 0.0f, grad_scale, t_);
  }
}

float clip_scale(double norm, float max_norm) {
  if (max_norm <= 0.0f || norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / norm);
}

}  // namespace gpt
