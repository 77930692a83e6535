// AdamW over a flat fp32 master buffer (the whole model here; a rank's shard under ZeRO). Weight decay is
// decoupled and applies to 2-D weights only: the optimizer walks the parameter ranges that intersect its
// slice of the model's flat layout. Owns the first and second moments (category: optimizer).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/allocator.h"
#include "model/layout.h"

namespace gpt {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

class AdamW {
 public:
  // Manages elements [begin, end) of the model's flat buffer (units concatenated in layout order).
  AdamW(Backend& backend, const ModelLayout& layout, int64_t begin, int64_t end, AdamWConfig config);

  // One update of master[0, end-begin) from grads (same indexing), gradients scaled by grad_scale first.
  void step(float* master, const float* grads, float lr, float grad_scale);

  int64_t steps_taken() const { return t_; }
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }
  int64_t numel() const { return end_ - begin_; }

 private:
  struct Range {
    int64_t begin, length;
    bool decay;
  };
  Backend& be_;
  AdamWConfig config_;
  int64_t begin_, end_;
  std::vector<Range> ranges_;  // relative to begin_
  Buffer m_, v_;
  int64_t t_ = 0;
};

// Global L2 norm of a gradient buffer and the clip scale min(1, max_norm / norm) (1 when max_norm <= 0).
float clip_scale(double norm, float max_norm);

}  // namespace gpt
