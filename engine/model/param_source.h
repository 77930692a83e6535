// ParamSource: how the model gets a unit's parameters and hands back its gradients, without knowing the
// strategy. ShardedParams (engine/parallel) implements it for every strategy: under `single` it holds
// everything; under zero3 it gathers units from shards and reduce-scatters gradients behind the same calls.
//
// Order contract: the model calls acquire/release/grads_done in the same order on every rank. The
// embed unit is acquired first and released last (the LM head is tied to its wte), like FSDP's root.
#pragma once

#include "core/dtype.h"

namespace gpt {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // The unit's full fp32 parameters, valid until release(unit).
  virtual const float* acquire(int unit) = 0;
  virtual void release(int unit) = 0;
  // The unit's parameters in bf16 when the source keeps such a copy (param_dtype bf16, where the fp32 parameters
  // acquire() returns are these values widened), so bf16 GEMMs take their weights without a cast; null when it
  // keeps none. Valid until release(unit). REQUIRES: unit acquired.
  virtual const bf16* acquired_bf16(int /*unit*/) { return nullptr; }
  // The unit's full-size fp32 gradient buffer; backward accumulates (+=) into it.
  // REQUIRES: unit acquired.
  virtual float* grads(int unit) = 0;
  // The unit's gradient for this micro-batch is complete (a strategy may start reducing it now).
  virtual void grads_done(int unit) = 0;
};

}  // namespace gpt
