// Helpers shared by the multi-rank training tests (gpt_mpi_tests): a tiny corpus every rank can read, a
// tiny run config whose global batch (12 sequences) splits over 1, 2, 3 and 4 ranks, and a training run.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "config/loader.h"
#include "data/prepare.h"
#include "train/trainer.h"

namespace gpt {

namespace fs_helpers = std::filesystem;

// A corpus prepared once by rank 0 into a directory every rank knows (named by rank 0's pid).
inline std::string shared_data_dir(Communicator& world) {
  int32_t pid = world.rank() == 0 ? static_cast<int32_t>(::getpid()) : 0;
  world.broadcast(&pid, 1, DType::kI32, 0).wait();
  const std::string dir = (fs_helpers::temp_directory_path() / ("gpt_mpi_strategies_" + std::to_string(pid))).string();
  if (world.rank() == 0 && !fs_helpers::exists(dir + "/data/train.bin")) {
    std::string text;
    for (int i = 0; i < 400; ++i) text += "to be or not to be, that is the question; " + std::to_string(i % 7) + "\n";
    fs_helpers::create_directories(dir);
    std::ofstream(dir + "/corpus.txt") << text;
    data::PrepareOptions prep;
    prep.inputs = {dir + "/corpus.txt"};
    prep.out_dir = dir + "/data";
    REQUIRE(data::prepare_dataset(prep).has_value());
  }
  world.barrier().wait();
  return dir;
}

// The micro-batch size make_config gives `world_size` ranks: 2 (gradient accumulation) wherever the ranks'
// rows allow, else all of them.
inline int micro_batch_size_for(int world_size) {
  const int rows = 12 / world_size;
  return rows % 2 == 0 ? 2 : rows;
}

inline RunConfig make_config(const std::string& dir, const std::string& out, int world_size, float dropout,
                             const std::string& ckpt) {
  const int global = 12;
  const int micro = micro_batch_size_for(world_size);
  const std::string yaml = "run: {out_dir: " + out +
                           ", threads: 1, seed: 5}\n"
                           "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, dropout: " +
                           std::to_string(dropout) +
                           "}\n"
                           "data: {train: " +
                           dir + "/data/train.bin, val: " + dir +
                           "/data/val.bin}\n"
                           "training: {steps: 10, micro_batch_size: " +
                           std::to_string(micro) + ", global_batch_sequences: " + std::to_string(global) +
                           ", lr: 3.0e-3, warmup_steps: 2, eval_interval: 0, eval_batches: 2,\n"
                           "  activation_checkpointing: " +
                           ckpt +
                           "}\n"
                           "logging: {level: warn}\n";
  auto cfg = load_run_config_text(yaml, "strategies_test", {});
  REQUIRE(cfg.has_value());
  return *cfg;
}

struct Result {
  std::vector<float> losses, weights;
  std::optional<float> val_loss;  // after the last step, if it was evaluated
  int64_t allocations_after_first_step = 0;
  std::array<int64_t, kNumMemCategories> planned_bytes{}, measured_bytes{};  // TrainSummary's, after step 1
  std::optional<int64_t> device_in_use_bytes;                                // TrainSummary's (a device)
  int64_t device_tracked_bytes = 0, device_tracked_buffers = 0;
  int64_t device_untracked_at_start = 0;
};

// The largest |a[i] - b[i]| (the sizes must match).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

// One run to its end (the test fails if it cannot be created or run), with `hooks` for a test backend and
// device communicators.
inline Result run_trainer(const RunConfig& cfg, Communicator& comm, TrainerHooks hooks = {}, int ranks_per_node = 1,
                          int local_rank = 0) {
  auto trainer = Trainer::create(cfg, comm, ranks_per_node, local_rank, std::move(hooks));
  INFO(trainer.status().message());
  REQUIRE(trainer.has_value());
  auto summary = (*trainer)->run();
  INFO(summary.status().message());
  REQUIRE(summary.has_value());
  return {summary->losses,
          (*trainer)->full_weights(),
          summary->final_val_loss,
          summary->allocations_after_first_step,
          summary->planned_bytes,
          summary->measured_bytes,
          summary->device_in_use_bytes,
          summary->device_tracked_bytes,
          summary->device_tracked_buffers,
          summary->device_untracked_at_start};
}

// The run must allocate nothing after step 1, and (the planner's promise, under every strategy) at step 1 exactly
// what its plan says in every memory category: the tracked peaks over what was allocated before it started (e.g. a
// probing Trainer still alive).
inline Result train(const RunConfig& cfg, Communicator& comm) {
  MemTracker::instance().reset_peaks();
  const MemStats before = MemTracker::instance().stats();
  Result r = run_trainer(cfg, comm);
  REQUIRE(r.allocations_after_first_step == 0);  // ARCHITECTURE invariant 4, under every strategy
  CHECK(!r.device_in_use_bytes);                 // no device: nothing the driver counts
  if (!r.losses.empty()) {                       // a step ran (a resume past the end takes none)
    int64_t planned = 0;
    for (const int64_t bytes : r.planned_bytes) planned += bytes;
    REQUIRE(planned > 0);  // the trainer planned
    for (size_t c = 0; c < kNumMemCategories; ++c) {
      CAPTURE(mem_category_name(static_cast<MemCategory>(c)));
      CHECK(r.measured_bytes[c] - before.current[c] == r.planned_bytes[c]);
    }
  }
  return r;
}

}  // namespace gpt
