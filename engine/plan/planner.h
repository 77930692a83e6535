// The analytical planner: bytes per rank per memory category and communication volume per optimizer step,
// for every data-parallel strategy, from the model shape and batch alone (nothing is allocated). It is
// modelled on what the code allocates, not on a textbook: ShardedParams' flat per-unit buffers padded to a
// multiple of the shard group, its fixed buffers and best-fit pools (gathers with prefetch, in-flight
// gradients, bf16 staging), simulated call by call in the model's acquire/grads/grads_done/release order
// (plan/memory_model.h), AdamW's two moments, and the exact tensor list of Gpt::prepare for the
// activation-checkpointing mode. The categories are the allocator's (core/allocator.h), so the trainer can
// log measured peaks beside planned ones; tests/plan's measured-vs-planned cases (one rank, and mpirun at
// N = 2..4 with hybrid) fail naming the category and strategy if code and plan drift apart.
//
// Communication is counted as the communicators count it (comm/communicator.h: per rank, reduce-scatter
// and all-gather by the padded full size), summed over the world, shard and replicate groups: elements and
// bytes per step by op. For ddp, zero1 and zero2 that is the ZeRO paper's accounting (Φ = padded parameter
// count: all-reduce Φ; reduce-scatter Φ + all-gather Φ), except that zero2 reduce-scatters every
// micro-batch; zero3 gathers per micro-batch Φ in forward and then only the blocks in backward (embed and
// head stay gathered; the paper counts 2Φ), or nothing more with reshard_after_forward off. Scalar
// all-reduces (the step's loss, the global grad norm: one element each) are left out.
//
// The ZeRO paper's own model-state arithmetic (Rajbhandari et al. 2020, section 5 / Figure 1 / Table 2:
// mixed precision, 2Ψ params + 2Ψ grads + KΨ optimizer state) is here too, for arbitrary sizes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/status.h"
#include "model/layout.h"
#include "parallel/sharded_params.h"  // Strategy

namespace gpt {

struct PlanInput {
  GptShape shape;
  int micro_batch = 1;                 // sequences per forward/backward (training.micro_batch_size)
  int seq_len = 0;                     // tokens per sequence; 0 = shape.block_size (what the trainer uses)
  int64_t micro_batches_per_step = 1;  // per rank: global batch / world_size / micro_batch
  int world_size = 1;                  // ranks in the data-parallel world
  int ranks_per_node = 1;              // ranks sharing one node's memory; the hybrid default shard group size
  int shard_group_size = 0;            // hybrid: ranks per shard group (parallel.shard_group_size); 0 = ranks_per_node
  std::string activation_checkpointing = "none";  // none | full | every:N | selective
  // run.device cuda: the fused attention keeps one log-sum-exp per query row, not the (T,T) probabilities, and
  // the CUDA backend's own workspaces (cuBLASLt, scratch, bf16 cast areas) count under workspace.
  bool fused_attention = false;
  // parallel.prefetch, reshard_after_forward, param_dtype and reduce_dtype. Master weights, optimizer state and
  // gradient accumulation are fp32 whatever these say; activations too, but for the GEMMs' inputs (the LayerNorm,
  // attention and GELU outputs), outputs (qkv, fc, the projections, the logits) and input gradients, bf16 when
  // fused_attention (run.device cuda) and param_dtype bf16 (bf16 compute).
  ShardingOptions sharding;
  // run.gelu_fusion: none | forward | full. Under full with bf16 compute the GELU backward is the projection GEMM's
  // epilogue (where it takes the width): the bf16 gradient at the GELU's input takes the place of the one at its
  // output, in which the unfused backward runs in place; the same memory.
  std::string gelu_fusion = "none";
  // The trainer's compute dtype: bf16 on a GPU under param_dtype bf16 (the CPU computes in fp32).
  bool bf16_compute() const { return fused_attention && sharding.param_dtype == DType::kBF16; }
  // Backend::gelu_backward_fused of the trainer's CUDA backend, for this shape.
  bool fused_gelu_backward() const;
};

// Returns an error naming the field when `in` cannot be planned (shape, batch, ranks, checkpointing mode,
// gelu_fusion).
[[nodiscard]] Status check_plan_input(const PlanInput& in);

// Elements (or bytes) per rank per optimizer step, by collective.
struct CommVolume {
  int64_t all_reduce = 0;
  int64_t reduce_scatter = 0;
  int64_t all_gather = 0;
  int64_t total() const { return all_reduce + reduce_scatter + all_gather; }
};

struct StrategyPlan {
  Strategy strategy = Strategy::kSingle;
  int shard_group_size = 1;  // ranks sharing the shards: world_size, or the shard group under hybrid
  int replicas = 1;          // hybrid: shard groups (> 1 only for hybrid)
  bool hybrid() const { return replicas > 1; }
  std::string name() const;  // "zero3", "hybrid-zero3"

  // Bytes per rank at the step's peak, by allocator category. Pools count at their steady-state size.
  int64_t params = 0;        // compute parameters: full copy (zero1/zero2, bf16 ddp), gathered units (zero3),
                             // bf16 parameter shards
  int64_t grads = 0;         // full buffers, shard accumulators, in-flight per-unit buffers (zero2/zero3)
  int64_t master = 0;        // fp32 master weights (fp32 single/ddp: also the compute parameters)
  int64_t optimizer = 0;     // AdamW m and v
  int64_t activations = 0;   // stored + recompute scratch + token copy (Gpt::prepare)
  int64_t workspace = 0;     // activation gradients for backward (Gpt::prepare); cuda: + the backend's own
  int64_t comm_buffers = 0;  // bf16 staging of reductions and gathers (category comm); none in fp32
  int64_t total = 0;         // sum of the above
  // Of the above: the pooled per-unit buffers (zero3's gathered units, zero2/zero3's in-flight gradients,
  // bf16 staging), which the ZeRO paper's per-device figures leave out.
  int64_t unit_buffers = 0;
  int64_t model_states() const { return params + grads + master + optimizer; }

  int64_t padded_params = 0;  // Φ: parameter count as laid out (units padded to a multiple of the shard group)
  CommVolume comm_elements_per_step;
  CommVolume comm_bytes_per_step;
  std::string note;  // what the figures include, in a line
};

// One plan per strategy: single (world_size == 1 only), ddp, zero1, zero2, zero3, in that order, then
// hybrid zero2 and zero3 when the shard group size S (shard_group_size, else ranks_per_node) has
// 1 < S < world_size (or S = shard_group_size = 1) and divides it.
// REQUIRES: check_plan_input(in).is_ok()
std::vector<StrategyPlan> plan_all(const PlanInput& in);

// The sharding options a run config asks for (parallel.prefetch, reshard_after_forward, param/reduce dtype).
ShardingOptions sharding_options(const ParallelSection& parallel);
// Errors, naming the keys, when the global batch does not split over `world_size` ranks into micro-batches.
[[nodiscard]] Status check_batch_split(const RunConfig& cfg, int world_size);
// The ranks that share the shards in a run of `world_size` ranks: under parallel.strategy hybrid,
// parallel.shard_group_size, or where that is 0 `ranks_per_node`; the world size otherwise. An error naming the
// key when it does not divide the world size. The trainer's mesh and the planner's input both come from it.
Expected<int> run_shard_group_size(const RunConfig& cfg, int world_size, int ranks_per_node);
// The planner's input for a run config at a world size (after check_batch_split). Under parallel.strategy
// hybrid, shard_group_size is run_shard_group_size's (0 otherwise), so that plan_all has the plan of every
// hybrid run the trainer accepts.
Expected<PlanInput> plan_input(const RunConfig& cfg, const GptShape& shape, int world_size, int ranks_per_node);

// The elements a step moves in the ring-equivalent sense (an all-reduce is a reduce-scatter plus an
// all-gather), the cost that choose_auto minimises.
int64_t ring_equivalent_elements(const CommVolume& v);

struct AutoChoice {
  Strategy strategy = Strategy::kSingle;
  std::string reason;
};
// What a run's planned buffers may take per rank on a device (run.device cuda): the least free device memory
// over the ranks when the run starts (after the CUDA context is made, before NCCL's communicators), less
// parallel.device_memory_reserve_gb, the room kept for what is allocated outside the plan later (NCCL's
// buffers, cudaMalloc's rounding).
struct DeviceBudget {
  int64_t free = 0;     // the least free device memory over the ranks (DeviceMemory's free + backend_bytes)
  int rank = 0;         // the first rank with that little
  int64_t reserve = 0;  // parallel.device_memory_reserve_gb, in bytes
  std::string gpu;      // how describe() names the device ("" = "rank <rank>'s GPU")
  int64_t bytes() const { return free > reserve ? free - reserve : 0; }
  // Whether `need` fails to fit only because of the reserve.
  bool reserve_in_the_way(int64_t need) const { return reserve > 0 && need <= free; }
  // "the 139.10 GiB free on rank 0's GPU less parallel.device_memory_reserve_gb (1.86 GiB): 137.24 GiB"
  std::string describe() const;
};

// The strategy `auto` runs: the least communication whose total fits in device_memory_gb (1 GB = 1e9
// bytes) or, where that is <= 0, in `device`'s budget (none: unlimited). Communication is
// ring_equivalent_elements, ties going to less sharding, which orders ddp <= zero1 <= zero2 < zero3 (single
// first at world size 1). Hybrid plans are not candidates: what they save is inter-node traffic, which an
// element count does not see. Fails when nothing fits, naming the smallest plan and what to change.
Expected<AutoChoice> choose_auto(const std::vector<StrategyPlan>& plans, double device_memory_gb,
                                 const std::optional<DeviceBudget>& device = std::nullopt);

// parallel.device_memory_reserve_gb in bytes.
int64_t device_memory_reserve_bytes(const ParallelSection& parallel);

// The plan a run of `strategy` with shard groups of `shard_group_size` ranks (run_shard_group_size) follows:
// hybrid when the groups are smaller than the world (hybrid with one group of the whole world runs as plain
// zero2/zero3). plan_all plans every run that plan_input accepts, so none is a bug, said in the error: a missing
// plan would otherwise skip the memory checks silently.
Expected<const StrategyPlan*> find_run_plan(const std::vector<StrategyPlan>& plans, Strategy strategy,
                                            int shard_group_size, int world_size);

// OK when `plan` fits in `device`'s budget; else an error (made before the plan's buffers are allocated) with the
// plan's figures, the budget's, and which of `plans` (the run's others) would fit.
[[nodiscard]] Status check_plan_fits(const StrategyPlan& plan, const std::vector<StrategyPlan>& plans,
                                     const DeviceBudget& device);

// "512 B", "3.0 KiB", "12.4 MiB", "1.23 GiB".
std::string format_bytes(int64_t bytes);

// ---- The ZeRO paper's model (mixed-precision Adam: 2Ψ fp16 params, 2Ψ fp16 grads, KΨ optimizer state).
enum class ZeroStage { kBaseline, kPos, kPosG, kPosGP };

struct ZeroPaperBytes {
  double baseline = 0;  // (2 + 2 + K)Ψ
  double pos = 0;       // 2Ψ + 2Ψ + KΨ/N
  double pos_g = 0;     // 2Ψ + (2 + K)Ψ/N
  double pos_g_p = 0;   // (2 + 2 + K)Ψ/N
  double at(ZeroStage s) const;
};

// Model-state bytes per device for Ψ parameters over n devices with optimizer multiplier k (Adam: 12).
ZeroPaperBytes zero_paper_model_state(double psi, int n, double k);
// The largest Ψ whose model states fit in device_bytes at the given stage.
double zero_paper_max_params(double device_bytes, int n, double k, ZeroStage stage);

}  // namespace gpt
