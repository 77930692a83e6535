// Gpt: the GPT-2 forward and backward, written by hand against the Backend. It owns activation memory
// (sized by prepare() for micro-batches of B x T, allocated once) but not parameters or gradients: those
// come from a ParamSource unit by unit, so the same code runs under every strategy.
//
// Per block:  x -> ln_1 -> qkv -> causal attention -> proj -> (+x) = r -> ln_2 -> fc -> gelu -> proj -> (+r)
// then ln_f and the tied LM head (logits = ln_f(x) @ wte^T), softmax cross-entropy. The head runs over chunks
// of at most head_rows() rows (forward GEMM, cross-entropy with dlogits in place, backward GEMMs), so the
// (rows, V) logits are held for one chunk only: the full (B*T, V) matrix, often the largest activation, is
// never stored.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

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

  // Allocates activations for micro-batches of B rows of T tokens (T <= block_size). Call again to resize, or
  // after the backend's GELU fusion changed (Backend::gelu_backward_fused: no gradient at the GELU's output then).
  // `loss_slots`: how many micro-batches' per-token losses forward_backward_into can hold before mean_losses reads
  // them (the micro-batches of a step).
  void prepare(int B, int T, int loss_slots = 1);

  // Rows of the LM head's chunks: at most kHeadRows (large enough that the head's GEMMs stay efficient). The
  // planner sizes the logits by the same function. set_head_rows (before prepare) is for tests.
  static constexpr int64_t kHeadRows = 4096;
  static int64_t head_rows(int64_t N, int64_t limit = kHeadRows) { return N < limit ? N : limit; }
  void set_head_rows(int64_t limit);
  // The elements between rows of the LM head's logits and their gradient: V rounded up to a multiple of 16, so
  // that every row starts 64-byte aligned (32 for bf16), as cuBLASLt's tensor-core GEMMs need of a leading
  // dimension (GPT-2's 50257 is odd: unpadded, the head's GEMMs would run unaligned kernels). The GEMMs and the
  // cross-entropy see only the first V columns; wte stays (V, C). The planner pads by the same function.
  static int64_t logits_stride(int64_t V) { return (V + 15) / 16 * 16; }

  // The dtype of the activations only GEMMs read (the ln_1, ln_2 and ln_f outputs, the GELU output, the gradient
  // at its input and the LM head's dlogits, which then get buffers of their own instead of overwriting fp32 ones):
  // the backend's compute dtype, so under bf16 compute they are stored in bf16, bit for bit what the GEMMs would
  // round fp32 copies to. set_gemm_input_dtype (before prepare) overrides it, for tests of exactly that.
  // (qkv, the attention output, its gradient dqkv, the fc output, which attention and the GELU also read, and the
  // GEMMs' input gradients, which GEMMs write, are stored in the compute dtype whatever this says.)
  DType gemm_input_dtype() const;
  void set_gemm_input_dtype(DType type);

  // Forward and backward of one micro-batch. inputs/targets are (B,T) token ids in host memory. Each token's loss
  // enters the gradient with weight `loss_scale` (1 / tokens in the global batch); gradients accumulate into the
  // ParamSource's buffers. Returns the micro-batch's mean loss.
  float forward_backward(ParamSource& params, const int32_t* inputs, const int32_t* targets, float loss_scale,
                         const StepContext& ctx);
  // forward_backward without waiting for it: the micro-batch's per-token losses stay on the backend in loss slot
  // `slot` (below prepare's loss_slots) until mean_losses reads them, so a device computes a step's micro-batches
  // back to back while the host queues them. REQUIRES: the slot's previous losses were read, or are not wanted.
  void forward_backward_into(ParamSource& params, const int32_t* inputs, const int32_t* targets, float loss_scale,
                             const StepContext& ctx, int slot);
  // The mean loss of each of loss slots [0, n), each summed on the host in token order (as forward_backward's):
  // one copy from the backend, which waits for them. Valid until the next call.
  const std::vector<float>& mean_losses(int n);
  // Forward only: mean loss over the micro-batch.
  float forward_loss(ParamSource& params, const int32_t* inputs, const int32_t* targets, const StepContext& ctx);
  // Forward only: logits (B,T,V) in host memory, valid until the next call.
  const float* forward_logits(ParamSource& params, const int32_t* inputs, const StepContext& ctx);

  // Inference over a KV cache (sampling), in buffers of its own. prepare_decode allocates, for one sequence of up to
  // max_T <= block_size tokens, every block's q|k|v at every position (the cache) and room for up to max_T new
  // tokens at a time. decode runs tokens[0, n) at positions [t0, t0 + n) over the positions [0, t0) that earlier
  // calls cached, caches theirs, and returns the logits (V) at the last one, in host memory until the next call:
  // forward_logits' at that position for the same t0 + n tokens, within rounding (the GEMMs of fewer rows may sum
  // in another order). A token costs one pass over the weights instead of a forward over its whole context.
  // No dropout. REQUIRES: prepare_decode(max_T), 1 <= n, t0 >= 0, t0 + n <= max_T.
  void prepare_decode(int max_T);
  const float* decode(ParamSource& params, const int32_t* tokens, int n, int t0);

 private:
  struct Acts;
  struct DecodeActs;
  struct BlockParams;
  struct BlockGrads;
  // A block's parameter pointers from its unit's flat parameters (fp32 or bf16, as the ParamSource holds them), and
  // its gradient pointers from the unit's gradient buffer.
  BlockParams block_params(ConstTensorPtr base) const;
  BlockGrads block_grads(float* base) const;
  void forward(ParamSource& params, const int32_t* inputs, const StepContext& ctx);
  // Block `layer` from its ln_1 output on (which the caller computed) up to the MLP's projection, left in
  // proj_out: the block's output x_out = res_mid + dropout(proj_out) is formed by the next op, fused with the
  // LayerNorm that reads it (the next block's ln_1 or ln_f). `recompute`: backward's rerun, which stops
  // after the GELU (the block's output is kept).
  void block_forward(int layer, const BlockParams& p, const float* x_in, bool recompute, const StepContext& ctx);
  // x_out = blocks[layer].res_mid + dropout(proj_out), and its LayerNorm into (out, mean, rstd).
  void block_output_layernorm(int layer, float* x_out, TensorPtr out, float* mean, float* rstd, ConstTensorPtr weight,
                              ConstTensorPtr bias, const StepContext& ctx);
  void block_backward(int layer, const BlockParams& p, const BlockGrads& g, const float* x_in, const StepContext& ctx);
  DropoutMask dropout(int site, int layer, const StepContext& ctx, uint64_t per_row) const;
  // The gradient before dropout `drop` of the residual-stream gradient dres (B,T,C): dres itself when the
  // mask is inactive, else dropout_backward's into the dtmp workspace.
  const float* dropout_grad(const float* dres, const DropoutMask& drop);
  // Where the LayerNorm backwards also write dres in bf16 for the projections' GEMMs (GEMM inputs in bf16, no
  // dropout), else null; and the projection's output gradient: that copy, or dropout_grad's.
  bf16* residual_grad_lo(const StepContext& ctx) const;
  ConstTensorPtr projection_dout(const float* dres, const DropoutMask& drop, const StepContext& ctx);
  // The LM head over rows [r0, r0 + rows) of ln_f's output: logits for the chunk into acts_->logits.
  void head_forward(int64_t r0, int64_t rows);
  const int32_t* upload_targets(const int32_t* targets);

  GptShape shape_;
  ModelLayout layout_;
  Backend& be_;
  ActivationCheckpointing ckpt_;
  int B_ = 0, T_ = 0;
  int64_t head_limit_ = kHeadRows;
  std::optional<DType> gemm_input_dtype_;
  Acts* acts_ = nullptr;
  std::unique_ptr<DecodeActs> dec_;
};

}  // namespace gpt
