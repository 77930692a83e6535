// Per-step metrics as JSON lines (one object per optimizer step) in the run's out_dir, plus small
// formatting helpers for progress lines.
#pragma once

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

}  // namespace gpt
