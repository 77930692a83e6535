// ShardedParams: the ParamSource of every data-parallel strategy, on one code path. A strategy is a set of
// choices: which of {optimizer state + master weights, gradients, parameters} are sharded over the group.
//
//   single/ddp: nothing sharded. Compute parameters are the fp32 master weights. Gradients accumulate in
//               a full buffer; in the step's last micro-batch the gradients are all-reduced in buckets of
//               consecutive units (async, each launched as soon as its units' backward is done, overlapping
//               the rest of backward; bucket_bytes as PyTorch DDP's bucket_cap_mb).
//   zero1:      master weights and AdamW state sharded; full gradients accumulate locally and are
//               reduce-scattered per unit in the last micro-batch; publish() all-gathers the updated shards.
//   zero2:      also gradients: every micro-batch, each unit's gradient is reduce-scattered as soon as its
//               backward is done into an fp32 shard accumulator, and the full-size buffer goes back to a pool.
//   zero3:      also parameters: at rest a rank holds only its shards; acquire() all-gathers a unit into a
//               pooled buffer and release() frees it (reshard_after_forward; otherwise units gathered in
//               forward stay until their backward), so no rank holds the model. Prefetch: acquire(u) also
//               issues the all-gathers of the next `prefetch` units in pass order (forward: up the blocks;
//               backward, which starts at the first grads() call: down the blocks), so communication
//               overlaps the current unit's compute; at most prefetch + 1 blocks are gathered at once.
//   hybrid:     zero2 or zero3 inside a shard group, with a replicate group across groups (HSDP): after the
//               in-group reduce-scatter, the gradient shard is all-reduced across replicas.
//
// Flat layout: unit u (numel_u) is padded to a multiple of the group size S; rank k owns elements
// [k*shard_u, (k+1)*shard_u) of the padded unit. The local master buffer concatenates this rank's shard of
// every unit (ddp: every unit whole). Threading: all calls from the training thread; collectives go to the
// group's comm stream in the same order on every rank. Compute waits for a collective by Work::join(): on a
// GPU the compute stream waits for it and the host goes on queueing kernels; on the CPU the thread waits.
#pragma once

#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/status.h"
#include "model/layout.h"
#include "model/param_source.h"
#include "optim/adamw.h"

namespace gpt {

enum class Strategy { kSingle, kDdp, kZero1, kZero2, kZero3 };

struct ShardingOptions {
  int prefetch = 1;                   // zero3: units gathered ahead of use (0, 1 or 2)
  bool reshard_after_forward = true;  // zero3: free a unit after its forward (else keep it for backward)
  // Mixed precision: parameters stored and communicated in param_dtype (computed through fp32 on the
  // CPU), gradients communicated in reduce_dtype; master weights, optimizer state and gradient
  // accumulation are always fp32.
  DType param_dtype = DType::kF32;
  DType reduce_dtype = DType::kF32;
  // ddp: consecutive units' gradients are all-reduced together until a bucket holds this many bytes (as
  // communicated); 0 = one all-reduce per unit.
  int64_t bucket_bytes = 25 << 20;
  // param_dtype bf16: round the parameters from the master weights stochastically (Bf16Rounding), with random
  // bits keyed by rounding_seed, the optimizer step and each weight's model index; else to nearest even.
  bool stochastic_rounding = false;
  uint64_t rounding_seed = 0;
};
Expected<Strategy> parse_strategy(std::string_view name);
std::string_view strategy_name(Strategy s);

class ShardedParams final : public ParamSource {
 public:
  // `group`: the ranks that shard among themselves. `replicas`: for hybrid, the ranks holding the same shard
  // in the other shard groups (zero2/zero3 only); null or size 1 otherwise. Both carry buffers of `backend`'s
  // memory (NCCL for a GPU). `host_group`: the same ranks as `group` for host-side values (the gradient norm,
  // gather_full_weights); null = `group`. All must outlive this.
  ShardedParams(const ModelLayout& layout, Backend& backend, Communicator& group, Strategy strategy,
                Communicator* replicas = nullptr, ShardingOptions options = {}, Communicator* host_group = nullptr);
  ~ShardedParams() override;

  // The unit's compute parameters. With param_dtype bf16 on a backend computing in bf16 (its compute dtype at
  // construction, which must not change) they are bf16 only: single/ddp the rounded master weights, zero1/zero2 the
  // gathered copy publish() keeps, zero3 the gathered unit, and no rank holds an fp32 copy of the model (FSDP's
  // mixed precision). Under fp32 compute (the CPU) they are fp32: the bf16 values widened.
  ConstTensorPtr acquire(int unit) override;
  void release(int unit) override;
  float* grads(int unit) override;
  void grads_done(int unit) override;

  // GPT-2 init of this rank's master region only (counter-based RNG: the same weights at any world size).
  void init(const GptShape& shape, uint64_t seed);
  // Before each micro-batch's forward/backward. `first`: the step's first (gradients start from zero);
  // `last`: its last (ddp/zero1 communicate gradients only then).
  void begin_micro_batch(bool first, bool last);
  // Waits for the step's gradient reductions: local_grads() then holds the summed gradient of the local
  // master region.
  void finish_grads();
  // ||g||^2 of the whole model's gradient (collective when gradients are sharded).
  double grad_sq_norm();
  // After the optimizer: compute parameters follow the master weights (all-gather for zero1/zero2).
  // `step`: the optimizer steps taken (0 after init), which keys stochastic rounding. `lo_written`: the
  // optimizer already wrote master_lo() (adamw_update_spans with rounding(step)), so only the gathers remain.
  void publish(int64_t step, bool lo_written = false);
  // The bf16 copy of the master region the optimizer may write with the update (null unless param_dtype
  // is bf16), and how it rounds at optimizer step `step`. Element i of the master buffer in region r is at
  // master_lo()[i + r.lo_shift]: zero1/zero2 hold it in the gathered parameters (this rank's block of each unit),
  // the others in a buffer laid out like the master weights.
  bf16* master_lo() {
    if (!lo_params()) return nullptr;
    return params_full_lo_.empty() ? param_shard_lo_.as<bf16>() : params_full_lo_.as<bf16>();
  }
  Bf16Rounding rounding(int64_t step) const;
  // The master regions as spans of the local buffers (no decay flags), for sum_squares_spans and rounding.
  const std::vector<OptimSpan>& region_spans() const { return region_spans_; }
  // The full fp32 weights, units concatenated without padding, on every rank (collective).
  std::vector<float> gather_full_weights();

  float* master() { return master_.as<float>(); }
  const float* local_grads() const { return local_grads_; }
  const std::vector<MasterRegion>& regions() const { return regions_; }
  int64_t local_numel() const { return local_numel_; }
  Strategy strategy() const { return strategy_; }

 private:
  struct UnitInfo {
    int64_t numel = 0, padded = 0, shard = 0;
    int64_t local_offset = 0;  // in master / local grads
    int64_t full_offset = 0;   // in the full params / grads buffers (padded units)
  };
  struct Pending {  // a zero2/zero3 reduce-scatter in flight
    Work work;
    int unit;
    Buffer full, shard;        // fp32 unit gradient and its reduced shard
    Buffer full_lo, shard_lo;  // the same in bf16 when reduce_dtype is bf16
  };
  struct GradReduce {  // a ddp/zero1 bf16 reduction in flight, cast back to fp32 `dst` when done
    Work work;
    Buffer lo;
    const bf16* result;
    float* dst;
    int64_t n;
  };
  bool shards_optimizer() const { return strategy_ >= Strategy::kZero1; }
  bool shards_grads() const { return strategy_ >= Strategy::kZero2; }
  Buffer take(std::vector<Buffer>& pool, int64_t n, MemCategory category, size_t elem_bytes = sizeof(float));
  bool lo_params() const { return options_.param_dtype == DType::kBF16; }
  bool lo_grads() const { return options_.reduce_dtype == DType::kBF16; }
  bool gathered(int unit) const;  // zero3: the unit's gathered buffers are taken (arrived or arriving)
  void start_gather(int unit);
  void free_gathered(int unit);
  void drain_pending(size_t keep);
  void flush_bucket();  // ddp: all-reduce the units [bucket_lo_, bucket_hi_]

  const ModelLayout& layout_;
  Backend& be_;
  Communicator& group_;
  Communicator* replicas_;
  Communicator& host_group_;
  Strategy strategy_;
  ShardingOptions options_;
  int rank_ = 0, size_ = 1;
  bool lo_only_ = false;   // the compute parameters are bf16 only (param_dtype bf16 under bf16 compute)
  bool backward_ = false;  // zero3: the current pass has reached backward
  std::vector<UnitInfo> units_;
  std::vector<MasterRegion> regions_;
  std::vector<OptimSpan> region_spans_;
  int64_t local_numel_ = 0, full_numel_ = 0;
  bool last_micro_ = true;
  int bucket_lo_ = -1, bucket_hi_ = -1;  // ddp: the units whose gradients wait in the open bucket

  Buffer master_;          // (local_numel) fp32 master weights; ddp: also the compute parameters
  Buffer params_full_;     // (full_numel) fp32 compute parameters: zero1/zero2, bf16 single/ddp; none when bf16 only
  Buffer params_full_lo_;  // (full_numel) the bf16 parameters as gathered, bf16 zero1/zero2 (their shards included)
  Buffer grads_full_;      // (full_numel) gradient accumulator, ddp/zero1
  Buffer grads_shard_;     // (local_numel) reduced gradient shards, zero1/zero2/zero3
  float* local_grads_ = nullptr;
  std::vector<Work> grad_works_;        // ddp/zero1 reductions of this step
  std::vector<GradReduce> lo_reduces_;  // ddp/zero1 bf16 reductions of this step
  Buffer param_shard_lo_;               // bf16 single/ddp: (full_numel) the parameters; zero3: (local_numel) the shards
  std::vector<Buffer> gathered_lo_;     // zero3 bf16: per unit, the gathered bf16 parameters
  std::vector<bool> expanded_;          // zero3 bf16 under fp32 compute: gathered_ holds the fp32 copy already
  std::vector<Buffer> lo_pool_;         // bf16 buffers (gathers, gradient reductions)
  std::vector<Buffer> gathered_;    // zero3: per unit, its gathered (or arriving) fp32 parameters; none if bf16 only
  std::vector<Work> gather_work_;   // zero3: per unit, the all-gather filling gathered_
  std::vector<int> acquired_;       // per unit: acquire count
  std::vector<Buffer> unit_grads_;  // zero2/zero3: per unit, its full gradient while in backward
  std::vector<Buffer> param_pool_, grad_pool_, shard_pool_;
  std::vector<Pending> pending_;
};

}  // namespace gpt
