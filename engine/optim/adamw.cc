#include "optim/adamw.h"

#include <algorithm>

namespace gpt {

AdamW::AdamW(Backend& backend, const ModelLayout& layout, const std::vector<MasterRegion>& regions, int64_t local_numel,
             AdamWConfig config)
    : be_(backend), config_(config) {
  std::vector<int64_t> unit_index(layout.units.size(), 0);  // each unit's first element in the whole model
  for (size_t u = 1; u < layout.units.size(); ++u) unit_index[u] = unit_index[u - 1] + layout.units[u - 1].numel;
  for (const MasterRegion& r : regions) {
    for (const ParamSpec& p : layout.units[r.unit].params) {
      const int64_t lo = std::max(r.begin, p.offset);
      const int64_t hi = std::min(r.begin + r.length, p.offset + p.numel);
      if (lo >= hi) continue;
      const int64_t local = r.local_offset + (lo - r.begin);
      const auto index = static_cast<uint64_t>(unit_index[static_cast<size_t>(r.unit)] + lo);
      // Merge with the previous span when contiguous (locally, in the model and in the bf16 copy) and of the same
      // kind.
      OptimSpan* last = spans_.empty() ? nullptr : &spans_.back();
      if (last != nullptr && last->decay == p.weight_decay && last->begin + last->length == local &&
          last->index + static_cast<uint64_t>(last->length) == index && last->lo_shift == r.lo_shift) {
        last->length += hi - lo;
      } else {
        spans_.push_back({local, hi - lo, index, p.weight_decay, r.lo_shift});
      }
    }
  }
  m_ = be_.alloc(local_numel * sizeof(float), MemCategory::kOptimizer);
  v_ = be_.alloc(local_numel * sizeof(float), MemCategory::kOptimizer);
}

void AdamW::step(float* master, const float* grads, float lr, float grad_scale, bf16* master_lo,
                 const Bf16Rounding& rounding) {
  ++t_;
  const AdamWStep s{lr, config_.beta1, config_.beta2, config_.eps, config_.weight_decay, grad_scale, t_};
  be_.adamw_update_spans(master, m(), v(), grads, master_lo, spans_, s, rounding);
}

float clip_scale(double norm, float max_norm) {
  if (max_norm <= 0.0f || norm <= max_norm) return 1.0f;
  return static_cast<float>(max_norm / norm);
}

}  // namespace gpt
