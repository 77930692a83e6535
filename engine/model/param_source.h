// ParamSource: how the model gets a unit's parameters and hands back its gradients, without knowing the
// strategy. ShardedParams (engine/parallel) implements it for every strategy: under `single` it holds
// everything; under zero3 it gathers units from shards and reduce-scatters gradients behind the same calls.
//
// Order contract: the model calls acquire/release/grads_done in the same order on every rank. The
// embed unit is acquired first and released last (the LM head is tied to its wte), like FSDP's root.
#pragma once

#include "backend/backend.h"

namespace gpt {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // The unit's full parameters, valid until release(unit): fp32, or bf16 where the source holds its parameters in
  // bf16 for a backend that computes in bf16 (param_dtype bf16 on a GPU). The model hands them to the ops as they
  // are: GEMMs take bf16 weights uncast and the other ops read bf16 parameters widened, so the step is the one on
  // their fp32 values, bit for bit, without an fp32 copy of the model.
  virtual ConstTensorPtr acquire(int unit) = 0;
  virtual void release(int unit) = 0;
  // The unit's full-size fp32 gradient buffer; backward accumulates (+=) into it.
  // REQUIRES: unit acquired.
  virtual float* grads(int unit) = 0;
  // The unit's gradient for this micro-batch is complete (a strategy may start reducing it now).
  virtual void grads_done(int unit) = 0;
};

}  // namespace gpt
