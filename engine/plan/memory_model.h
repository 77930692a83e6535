// The pieces of the planner that mirror allocation code call by call, kept apart so a change to that code
// has one place to follow here:
//   activation_bytes         <-> Gpt::prepare (model/gpt.cc): the tensors kept, the recompute scratch and the
//                                activation-gradient workspace, each rounded up to 64 bytes as its Carver does.
//   unit_sizes               <-> ShardedParams' UnitInfo: per-unit numel, padded size and shard.
//   simulate_sharded_params  <-> ShardedParams (parallel/sharded_params.cc) with sizes instead of buffers: its
//                                fixed buffers, best-fit pools (param, grad, shard, bf16), zero3 gathers with
//                                prefetch and reshard_after_forward, drain_pending(2), ddp buckets, bf16 staging,
//                                hybrid replica all-reduces, and the collectives' element counts; driven as the Trainer
//                                drives it (init, steps of micro-batches, eval forwards).
//   cuda_backend_workspace   <-> CudaBackend's own device memory (kernels/cuda/workspace.h has the kernels' sizes).
// tests/plan compare all of it with MemTracker and the communicators' counters (the CUDA part on a GPU only).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/communicator.h"
#include "core/allocator.h"
#include "model/activation_checkpointing.h"
#include "model/layout.h"
#include "parallel/sharded_params.h"

namespace gpt {

struct ActivationBytes {
  int64_t stored = 0;     // kept for backward: residual stream, per-block sets, ln_f, logits, losses
  int64_t scratch = 0;    // one block's recompute set (any checkpointing) and a projection temporary
  int64_t tokens = 0;     // int32 token ids copied to the backend: inputs and targets
  int64_t workspace = 0;  // activation gradients (category workspace)
};
// Bytes Gpt::prepare(B, T, loss_slots) allocates.
// `fused_attention`: the attention state is Backend::attention_state_floats of the CUDA backend (B,NH,T)
// instead of the CPU's (B,NH,T,T). `gemm_inputs`: Gpt::gemm_input_dtype, the dtype of the activations GEMMs
// read (bf16 under bf16 compute); `compute`: the backend's compute dtype, that of the GEMMs' outputs (qkv, fc:
// attention's and the GELU's inputs; the projections) and input gradients, by default gemm_inputs.
// `fused_gelu_backward`: Backend::gelu_backward_fused (run.gelu_fusion full on cuda, bf16 compute, 4C a multiple of 8):
// no gradient at the GELU's output (d4) in the workspace, but one at its input in the GEMM input dtype (unfused: in
// place in d4 where the dtypes agree).
ActivationBytes activation_bytes(const GptShape& shape, int B, int T, const ActivationCheckpointing& ckpt,
                                 bool fused_attention = false, DType gemm_inputs = DType::kF32,
                                 std::optional<DType> compute = std::nullopt, bool fused_gelu_backward = false,
                                 int loss_slots = 1);

// The CUDA backend's own device memory (category workspace) over a training step: cuBLASLt's workspace, the
// shared scratch area at the largest request of any op (embedding's cub sort storage estimated), the bf16 cast
// areas under bf16 compute (the weights, for ParamSources with fp32 parameters; the fp32 output gradients of the
// block's GEMMs; the biases; Gpt's GEMM input activations come in bf16), and sum_squares' result. `local_numel`: the
// optimizer's local buffer; `spans`: an upper bound of its spans (AdamW's runs).
int64_t cuda_backend_workspace_bytes(const GptShape& shape, int B, int T, bool bf16_compute, int64_t local_numel,
                                     int64_t spans);

struct UnitSizes {
  std::vector<int64_t> numel, padded, shard;  // per unit, in layout order
  int64_t full = 0;                           // sum of padded: the full params / grads buffers (ddp: unpadded)
  int64_t local = 0;                          // sum of shard: the local master buffer
};
// Units are padded to a multiple of group_size only when the optimizer state is sharded (zero1 and up).
UnitSizes unit_sizes(const ModelLayout& layout, Strategy strategy, int group_size);

struct ShardedParamsSetup {
  Strategy strategy = Strategy::kDdp;
  int group_size = 1;  // the shard group (the whole data-parallel world unless hybrid)
  int replicas = 1;    // hybrid: shard groups holding the same shards (> 1 only for zero2/zero3)
  ShardingOptions options;
  // The backend computes in bf16 (a GPU): with param_dtype bf16 the compute parameters are bf16 only.
  bool bf16_compute = false;
};

struct ShardedParamsFigures {
  std::array<int64_t, kNumMemCategories> bytes{};  // steady-state bytes by category (pools never shrink)
  int64_t pooled_bytes = 0;                        // of those, what the pools hold (per-unit, in-flight buffers)
  std::array<int64_t, kNumCommOps> elements{};     // one optimizer step, per rank, as the communicators count
  std::array<int64_t, kNumCommOps> comm_bytes{};
  int64_t at(MemCategory c) const { return bytes[static_cast<size_t>(c)]; }
};

// Runs ShardedParams' allocation and communication logic for a trainer's start (init) and four optimizer steps
// of `micro_batches` forward/backward passes, with an eval forward after each of the first two, and returns
// the bytes held afterwards and the last step's collectives. Scalar all-reduces (loss, grad norm) are left out.
ShardedParamsFigures simulate_sharded_params(const ModelLayout& layout, const ShardedParamsSetup& setup,
                                             int64_t micro_batches);

}  // namespace gpt
