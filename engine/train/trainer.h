// Trainer: one training run from a validated RunConfig, on every rank of the world communicator. create()
// checks everything that can be checked before anything is written (data files, tokenizer, vocab and block
// size against the data, batch sizes against the world size) and allocates the model; run() (rank 0) creates
// out_dir and saves the resolved config, then every rank trains: each data-parallel rank takes its rows of
// the same global batch, micro-batch by micro-batch (gradient accumulation), the strategy reduces the
// gradients, the global norm is clipped, AdamW updates the local master weights; evaluation every
// eval_interval steps; rank 0 writes metrics JSONL and logs progress. Every checkpoint.every steps (and
// after the last) every rank writes its slices of a sharded checkpoint; the final weights go to
// out_dir/model the same way. checkpoint.resume continues a run from a checkpoint of any world size and
// strategy, exactly (same losses bit for bit at the same world size and strategy).
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "comm/communicator.h"
#include "config/run_config.h"
#include "core/status.h"
#include "core/test_fault.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "parallel/sharded_params.h"
#include "plan/planner.h"

namespace gpt {

struct TrainSummary {
  int64_t steps = 0;
  float final_loss = 0.0f;
  std::optional<float> final_val_loss;
  double seconds = 0.0;        // wall time of the run's loop: steps, evaluations and saves
  double train_seconds = 0.0;  // the training steps alone (the sum of metrics.jsonl's step_ms)
  double tokens_per_s = 0.0;   // over train_seconds, as the per-step metrics count it
  std::vector<float> losses;   // per step, mean over the global batch
  bool interrupted = false;    // stopped early by a signal, after saving a checkpoint
  // Tracked allocations (host or device) after this run's first step, evaluations and saves included: 0 when
  // the memory pools were sized up front, as they must be.
  int64_t allocations_after_first_step = 0;
  // Per MemCategory (its order), after the first step: the plan's bytes and the tracked peak, as the log's
  // planned-vs-measured table prints them. All zero when the trainer has no plan or the run took no step.
  std::array<int64_t, kNumMemCategories> planned_bytes{};
  std::array<int64_t, kNumMemCategories> measured_bytes{};
  // After the first step, on a device: what the driver counts in use (Backend::device_memory_in_use) and the
  // tracked buffers' bytes at that moment; the difference is the CUDA context, cuBLAS(Lt), NCCL and allocation
  // rounding, which no plan counts. Unset on the CPU or when the run took no step.
  std::optional<int64_t> device_in_use_bytes;
  int64_t device_tracked_bytes = 0;
  int64_t device_tracked_buffers = 0;  // how many buffers those bytes are
  // The same difference when the run started (before its buffers and NCCL's communicators): what
  // parallel.device_memory_reserve_gb must cover is the growth since, device_in_use_bytes - device_tracked_bytes
  // - this. Set with device_in_use_bytes.
  int64_t device_untracked_at_start = 0;
};

// What a test may put in place of the real thing: the backend (instead of run.device's) and how device
// communicators are made (instead of make_device_communicator, e.g. for a fake device without NCCL).
struct TrainerHooks {
  std::unique_ptr<Backend> backend;
  std::function<Expected<std::unique_ptr<Communicator>>(Communicator& bootstrap, const Backend& backend,
                                                        std::string name)>
      device_communicator;
};

class Trainer {
 public:
  // `world` must outlive the Trainer; every rank calls create() and run(). `ranks_per_node` is the default
  // shard group size of the hybrid strategy; with `local_rank` (this rank's index on its node) it also picks
  // the GPU under run.device: cuda.
  ~Trainer();
  static Expected<std::unique_ptr<Trainer>> create(const RunConfig& config, Communicator& world, int ranks_per_node = 1,
                                                   int local_rank = 0, TrainerHooks hooks = {});
  Expected<TrainSummary> run();  // on an error, waits for a background save before returning it

  // Mean validation loss over eval_batches micro-batches (the same batches at every evaluation), the
  // batches shared out over the ranks; the same value on every rank and at every world size for the same
  // weights; none without a validation split (an empty data.val). Collective: every rank calls it.
  std::optional<float> evaluate();
  const GptShape& shape() const { return shape_; }
  Strategy strategy() const { return params_->strategy(); }
  // The full fp32 weights in layout order (collective: every rank calls it).
  std::vector<float> full_weights() { return params_->gather_full_weights(); }
  // FLOPs per token of one training step by 6N + 12 L H Q T (N without position embeddings).
  double flops_per_token() const;
  // One device's dense bf16 peak FLOP/s for MFU: logging.peak_tflops, else the backend's; 0 = unknown.
  double peak_flops() const;

 private:
  Trainer(const RunConfig& config, Communicator& world, Strategy strategy, int shard_group_size, GptShape shape,
          data::DataLoader train, std::optional<data::DataLoader> val, std::optional<data::Tokenizer> tokenizer,
          ActivationCheckpointing ckpt, StrategyPlan plan, std::optional<CheckpointReader> resume,
          std::unique_ptr<Backend> backend, TrainerHooks hooks);
  // After the constructor: the device communicators, the parameters (initialised), the optimizer, the model's
  // activations.
  Status init_state();
  // trainer_checkpoint.cc: the checkpoint named by checkpoint.resume, checked against the run (or none).
  static Expected<std::optional<CheckpointReader>> open_resume(const RunConfig& config, const GptShape& shape,
                                                               Communicator& world);
  // The weights checkpoint.init_from names, checked against the run's shape (or none).
  static Expected<std::optional<CheckpointReader>> open_init_from(const RunConfig& config, const GptShape& shape,
                                                                  Communicator& world);
  // The first `sections` of master, adam_m, adam_v: the slices this rank holds under its own strategy.
  [[nodiscard]] Status read_local_slices(const CheckpointReader& reader, int sections);
  // Loads the resume checkpoint's slices this rank holds under its own strategy, the optimizer step, the data
  // position; sets start_step_.
  [[nodiscard]] Status restore();
  // checkpoint.init_from: the master weights only, at step 0.
  [[nodiscard]] Status load_initial_weights(const CheckpointReader& reader);
  // Collective: a checkpoint of the state after `steps_done` steps into <checkpoint root>/step_N, or
  // (model_only) the weights into <out_dir>/model; every rank writes its own slices.
  // checkpoint.async: the slices are copied to host memory (the only time the loop is blocked) and written
  // by a background thread over a communicator of its own; the next save (or the end of the run) waits for it.
  [[nodiscard]] Status save(int64_t steps_done, bool model_only);
  // Whether the run in out_dir finished at `steps` (final model and summary written), as rank 0 sees it, on every
  // rank. Collective.
  bool run_finished(const std::filesystem::path& out_dir, int64_t steps);
  std::vector<SaveSlice> save_slices() const;  // this rank's share of a checkpoint
  void allocate_save_copy();                   // checkpoint.async, at start-up
  // Waits for a background save; its result.
  [[nodiscard]] Status wait_for_save();
  std::string checkpoint_root() const;
  // Rank 0, after the first step: the planner's bytes per category beside the tracked allocator's peaks.
  // Fills summary's planned_bytes and measured_bytes; rank 0 logs them.
  void log_planned_vs_measured(TrainSummary& summary) const;
  void log_device_memory(TrainSummary& summary) const;
  CommStats comm_stats() const;
  std::string strategy_label() const;  // "zero3", or "hybrid:zero3" (summary.json, checkpoint manifests)
  // Rank 0: <out_dir>/summary.json.
  [[nodiscard]] Status write_summary(const TrainSummary& summary, int64_t steps_done, const std::string& model_dir);
  // One optimizer step; an error when the loss or gradient is non-finite under training.nonfinite: stop.
  Expected<float> train_step(int64_t step);
  Expected<TrainSummary> run_steps();
  // The first unit (layout order) whose gradient has a non-finite element on any rank, or -1 (collective).
  int first_nonfinite_unit();

  RunConfig config_;
  Communicator& world_;
  std::unique_ptr<Communicator> shard_group_, replicate_group_;  // hybrid only
  // run.device cuda: the same groups on the device's communicator (NCCL) for parameters and gradients.
  std::unique_ptr<Communicator> device_shard_group_, device_replicate_group_;
  Strategy strategy_ = Strategy::kSingle;
  GptShape shape_;
  data::DataLoader train_;
  std::optional<data::DataLoader> val_;  // none when data.val is empty: no evaluations
  std::optional<data::Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  TrainerHooks hooks_;  // the device communicators' maker, when a test replaces it
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<ShardedParams> params_;
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule schedule_;
  int64_t rows_per_rank_ = 0;              // of the global batch
  std::vector<int32_t> inputs_, targets_;  // one micro-batch
  double last_grad_norm_ = 0.0;
  std::string profile_report_;   // the backend's op times (GPT_TRAIN_CUDA_PROFILE=1), steps 2 to the last
  bool stop_requested_ = false;  // a rank received a stop signal before this step's end
  bool step_skipped_ = false;    // training.nonfinite: skip_step skipped this step's update
  const std::optional<TestFault> fault_ = test_fault();  // GPT_TRAIN_FAULT, read once for the step's hooks
  StrategyPlan plan_;                                    // the planner's figures for this run's strategy
  int64_t device_untracked_at_start_ = 0;                // on a device: TrainSummary's device_untracked_at_start
  std::optional<CheckpointReader> resume_;
  int64_t start_step_ = 0;                   // steps already taken (resumed runs)
  std::unique_ptr<Communicator> save_comm_;  // saves' collectives (unwatched; the async writer's thread)
  std::unique_ptr<float[]> save_copy_;       // checkpoint.async: the slices being written (uninitialised:
  size_t save_copy_size_ = 0;                // zero-filling would double the time the loop is blocked)
  std::thread save_thread_;
  Status save_status_;
};

}  // namespace gpt
