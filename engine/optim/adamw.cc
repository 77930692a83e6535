#include "optim/adamw.h"

#include <algorithm>

namespace gpt {

AdamW::AdamW(Backend& backend, const ModelLayout& layout, const std::vector<MasterRegion>& regions,
             int64_t local_numel, AdamWConfig config)
    : be_(backend), config_(config) {
  for (const MasterRegion& r : regions) {
    for (const ParamSpec& p : layout.units[r.unit].params) {
      const int64_t lo = std::max(r.begin, p.offset);
      const int64_t hi = std::min(r.begin + r.length, p.offset + p.numel);
      if (lo >= hi) continue;
      const int64_t local = r.local_offset + (lo - r.begin);
      // Merge with the previous range when contiguous and of the same kind: fewer kernel calls.
      if (!ranges_.empty() && ranges_.back().decay == p.weight_decay &&
          ranges_.back().begin + ranges_.back().length == local) {
        ranges_.back().length += hi - lo;
      } else {
        ranges_.push_back({local, hi - lo, p.weight_decay});
      }
    }
  }
  m_ = be_.alloc(local_numel * sizeof(float), MemCategory::kOptimizer);
  v_ = be_.alloc(local_numel * sizeof(float), MemCategory::kOptimizer);
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
