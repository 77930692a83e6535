// AdamW over a rank's fp32 master weights: the whole model (single, ddp) or this rank's shards of every
// unit (ZeRO). The master buffer is a list of regions, each a slice [begin, begin + length) of one unit's
// flat layout stored at `local_offset` in the local buffers. Weight decay is decoupled and applies to 2-D
// weights only: the optimizer walks the parameter ranges that intersect each region. Owns the first and
// second moments (category: optimizer), laid out like the master buffer.
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

// A slice of one unit's flat layout held locally. `length` excludes any padding past the unit's end. The bf16 copy
// of the region (master_lo of AdamW::step) starts lo_shift elements past local_offset (OptimSpan::lo_shift).
struct MasterRegion {
  int unit = 0;
  int64_t begin = 0;
  int64_t length = 0;
  int64_t local_offset = 0;
  int64_t lo_shift = 0;
};

class AdamW {
 public:
  // `local_numel`: size of the local master buffer (regions plus padding).
  AdamW(Backend& backend, const ModelLayout& layout, const std::vector<MasterRegion>& regions, int64_t local_numel,
        AdamWConfig config);

  // One update of master from grads (both laid out like the local master buffer), gradients scaled by
  // grad_scale first (global-norm clipping): one Backend::adamw_update_spans over the whole buffer (one
  // launch on a GPU). master_lo, when not null, gets the updated weights in bf16, rounded by `rounding`.
  void step(float* master, const float* grads, float lr, float grad_scale, bf16* master_lo = nullptr,
            const Bf16Rounding& rounding = {});

  int64_t steps_taken() const { return t_; }
  void set_steps_taken(int64_t t) { t_ = t; }  // resuming from a checkpoint
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }

 private:
  Backend& be_;
  AdamWConfig config_;
  std::vector<OptimSpan> spans_;  // the parameters' runs in the local buffers, each decayed or not
  Buffer m_, v_;
  int64_t t_ = 0;
};

// The clip scale min(1, max_norm / norm) (1 when max_norm <= 0).
float clip_scale(double norm, float max_norm);

}  // namespace gpt
