// Per-step metrics as JSON lines (one object per optimizer step) in the run's out_dir, plus small
// formatting helpers for progress lines.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "comm/communicator.h"
#include "core/allocator.h"
#include "core/status.h"

namespace gpt {

struct StepMetrics {
  int64_t step = 0;
  float loss = 0.0f;
  std::optional<float> val_loss;
  float lr = 0.0f;
  double grad_norm = 0.0;
  bool skipped = false;  // training.nonfinite: skip_step skipped this step's update
  double tokens_per_s = 0.0;
  double step_ms = 0.0;
  double gflops = 0.0;  // achieved, by 6N + 12 L H Q T FLOPs per token
  MemStats memory;      // peak bytes per category so far
  CommStats comm;       // collectives so far, per op (cumulative)
};

class MetricsWriter {
 public:
  // Truncates `path`, except that a resumed run keeps the lines of steps <= keep_through_step.
  static Expected<MetricsWriter> open(const std::string& path, int64_t keep_through_step = 0);
  // {"step":1,"loss":..,"val_loss":..,"lr":..,"grad_norm":..,"tokens_per_s":..,"step_ms":..,"gflops":..,
  //  "mem_peak_bytes":{"params":..,...,"total":..},
  //  "comm":{"all_reduce":{"calls":..,"elements":..,"bytes":..,"seconds":..},...}}
  [[nodiscard]] Status write(const StepMetrics& m);

 private:
  explicit MetricsWriter(std::string path) : path_(std::move(path)) {}
  std::string path_;
  std::ofstream out_;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

// Rank 0's progress: a plain log line every `interval` steps (and at evals and the last step) with step/total,
// loss, val loss, lr, grad norm, step time, tokens/s, achieved GFLOP/s (and MFU on GPUs), peak memory and ETA,
// averaged over
// the steps since the previous line; when stderr is a terminal, also a status line rewritten every step.
class Progress {
 public:
  // `peak_flops`: all ranks' devices together (MFU = achieved / peak); 0 leaves MFU out.
  Progress(int64_t first_step, int64_t total_steps, int64_t interval, double tokens_per_step, double flops_per_token,
           bool enabled, double peak_flops = 0.0);
  ~Progress() { clear_live(); }
  // After step m.step (1-based) took m.step_ms.
  void update(const StepMetrics& m);
  void clear_live();  // before logging something else

 private:
  int64_t first_step_, total_, interval_;
  double tokens_per_step_, flops_per_token_, peak_flops_;
  bool enabled_, live_;
  bool live_shown_ = false;
  std::chrono::steady_clock::time_point last_live_{};
  double elapsed_s_ = 0.0, window_s_ = 0.0;
  int64_t window_steps_ = 0;
};

// The end-of-run summary, <out_dir>/summary.json (written atomically by rank 0).
struct RunSummary {
  int64_t steps_done = 0;   // steps taken by the whole run, resumed or not
  int64_t total_steps = 0;  // training.steps
  int64_t steps_this_run = 0;
  bool interrupted = false;  // stopped by a signal (a checkpoint was written)
  float final_loss = 0.0f;
  std::optional<float> final_val_loss;
  double seconds = 0.0, train_seconds = 0.0, tokens_per_s = 0.0, gflops = 0.0;  // rates over train_seconds
  std::optional<double> mfu;  // achieved / the devices' peak, when the peak is known (GPUs)
  std::string strategy;
  int world_size = 1;
  MemStats memory;
  // The planner's bytes per MemCategory (what step 1 is held to; mem_peak_bytes are the whole run's peaks), when
  // the run planned and took a step.
  std::optional<std::array<int64_t, kNumMemCategories>> mem_planned;
  // Rank 0's device memory after step 1 as the driver counts it, its tracked buffers then, and the untracked
  // bytes at the start (TrainSummary's).
  std::optional<int64_t> device_in_use_bytes;
  int64_t device_tracked_bytes = 0;
  int64_t device_untracked_at_start = 0;
  CommStats comm;
  std::string model_dir, latest_checkpoint;  // "" when none
};
[[nodiscard]] Status write_run_summary(const std::string& path, const RunSummary& s);

}  // namespace gpt
