// The pieces of the planner that mirror allocation code call by call, kept apart so a change to that code
// has one place to follow here:
//   activation_elements  <-> Gpt::prepare (model/gpt.cc): the tensors kept, the recompute scratch and the
//                            activation-gradient workspace, each rounded up to 16 floats as its Carver does.
//   unit_sizes           <-> ShardedParams' UnitInfo: per-unit numel, padded size and shard.
//   simulate_pools       <-> ShardedParams' take()/release()/grads_done()/drain_pending(2) pools, driven in
//                            Gpt::forward_backward's acquire/grads/grads_done/release order.
#pragma once

#include <cstdint>
#include <vector>

#include "model/activation_checkpointing.h"
#include "model/layout.h"
#include "parallel/sharded_params.h"

namespace gpt {

struct ActivationElements {
  int64_t stored = 0;     // kept for backward: residual stream, per-block sets, ln_f, logits, losses
  int64_t scratch = 0;    // one block's recompute set (any checkpointing) and a projection temporary
  int64_t tokens = 0;     // int32 token ids copied for embedding backward
  int64_t workspace = 0;  // activation gradients (category workspace)
};
// Elements Gpt::prepare(B, T) allocates.
ActivationElements activation_elements(const GptShape& shape, int B, int T, const ActivationCheckpointing& ckpt);

struct UnitSizes {
  std::vector<int64_t> numel, padded, shard;  // per unit, in layout order
  int64_t full = 0;   // sum of padded: the full params / grads buffers (ddp: unpadded)
  int64_t local = 0;  // sum of shard: the local master buffer
};
// Units are padded to a multiple of world_size only when the optimizer state is sharded (zero1 and up).
UnitSizes unit_sizes(const ModelLayout& layout, Strategy strategy, int world_size);

// Steady-state elements held by ShardedParams' pools (they never shrink), zero2/zero3 only.
struct PoolElements {
  int64_t gathered_params = 0;  // zero3: all-gathered units
  int64_t unit_grads = 0;       // full-size per-unit gradients while in backward or being reduce-scattered
  int64_t grad_shards = 0;      // reduce-scatter receive buffers in flight
};
// Runs two optimizer steps of `micro_batches` forward/backward each, with an eval forward in between.
PoolElements simulate_pools(const UnitSizes& units, int n_layer, Strategy strategy, int64_t micro_batches);

}  // namespace gpt
