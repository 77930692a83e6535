// Gpt: the GPT-2 forward and backward, written by hand against the Backend. It owns activation memory
// (sized by prepare() for micro-batches of B x T, allocated once) but not parameters or gradients: those
// come from a ParamSource unit by unit, so the same code runs under every strategy.
//
// Per block:  x -> ln_1 -> qkv -> causal attention -> proj -> (+x) = r -> ln_2 -> fc -> gelu -> proj -> (+r)
// then ln_f and the tied LM head (logits = ln_f(x) @ wte^T), softmax cross-entropy.
#pragma once

#include <cstdint>

#include "backend/backend.h"
#include "core/allocator.h"
#include "model/activation_checkpointing.h"
#include "model/layout.h"
#include "model/param_source.h"

namespace gpt {

// What makes a forward unique for dropout: masks are keyed by (seed, step, site, layer, global row), so
// they depend neither on how the global batch is split into micro-batches or ranks nor on recomputation.
struct StepContext {
  uint64_t seed = 0;
  int64_t step = 0;        // optimizer step
  int64_t row_offset = 0;  // index of this micro-batch's first row within the global batch
  bool training = true;    // false: no dropout
};

class Gpt {
 public:
  Gpt(const GptShape& shape, Backend& backend, ActivationCheckpointing ckpt = {});
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptShape& shape() const { return shape_; }
  const ModelLayout& layout() const { return layout_; }

  // Allocates activations for micro-batches of B rows of T tokens (T <= block_size). Call again to resize.
  void prepare(int B, int T);

  // Forward and backward of one micro-batch. inputs/targets are (B,T) token ids in host memory. Each token's loss
  // enters the gradient with weight `loss_scale` (1 / tokens in the global batch); gradients accumulate into the
  // ParamSource's buffers. Returns the micro-batch's mean loss.
  float forward_backward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float loss_scale,
                         const StepContext& ctx);
  // Forward only: mean loss over the micro-batch.
  float forward_loss(ParamSource& params, const int32_t* inputs, const int32_t* targets, const StepContext& ctx);
  // Forward only: logits (B,T,V) in host memory, valid until the next call.
  const float* forward_logits(ParamSource& params, const int32_t* inputs, const StepContext& ctx);

 private:
  struct Acts;
  struct BlockParams;
  BlockParams block_params(const float* base) const;
  void forward(ParamSource& params, const int32_t* inputs, const StepContext& ctx);
  // Block `layer` from its ln_1 output on (which the caller computed) up to the MLP's projection, left in
  // proj_out: the block's output x_out = res_mid + dropout(proj_out) is formed by the next op, fused with the
  // LayerNorm that reads it (the next block's ln_1 or ln_f). `recompute`: backward's rerun, which stops
  // after the GELU (the block's output is kept).
  void block_forward(int layer, const BlockParams& p, const float* x_in, bool recompute, const StepContext& ctx);
  // x_out = blocks[layer].res_mid + dropout(proj_out), and its LayerNorm into (out, mean, rstd).
  void block_output_layernorm(int layer, float* x_out, float* out, float* mean, float* rstd, const float* weight,
                              const float* bias, const StepContext& ctx);
  void block_backward(int layer, const BlockParams& p, const BlockParams& g, const float* x_in, const StepContext& ctx);
  DropoutMask dropout(int site, int layer, const StepContext& ctx, uint64_t per_row) const;
  float mean_loss();
  const int32_t* upload_targets(const int32_t* targets);

  GptShape shape_;
  ModelLayout layout_;
  Backend& be_;
  ActivationCheckpointing ckpt_;
  int B_ = 0, T_ = 0;
  Acts* acts_ = nullptr;
};

}  // namespace gpt
