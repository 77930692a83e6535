#include "train/metrics.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include "core/atomic_file.h"
#include "plan/planner.h"

namespace gpt {

Expected<MetricsWriter> MetricsWriter::open(const std::string& path, int64_t keep_through_step) {
  MetricsWriter w(path);
  std::string kept;
  if (keep_through_step > 0) {  // a resumed run: keep the lines of the steps before the checkpoint
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      long long step = 0;
      if (std::sscanf(line.c_str(), "{\"step\":%lld", &step) == 1 && step <= keep_through_step) kept += line + "\n";
    }
  }
  if (keep_through_step > 0) {
    // Replaced atomically, so a crash here cannot lose the kept history; then appended to.
    GPT_RETURN_IF_ERROR(write_file_atomically(path, {std::span<const char>(kept)}));
    w.out_.open(path, std::ios::out | std::ios::app);
  } else {
    w.out_.open(path, std::ios::out | std::ios::trunc);
  }
  if (!w.out_) return Status::io_error("cannot open metrics file '" + path + "' for writing");
  return w;
}

namespace {
// A JSON number, or null for NaN/Inf (which JSON cannot hold).
std::string num(double v, const char* spec) { return std::isfinite(v) ? fmt::format(fmt::runtime(spec), v) : "null"; }
}  // namespace

Status MetricsWriter::write(const StepMetrics& m) {
  std::string line = fmt::format(R"({{"step":{},"loss":{},)", m.step, num(m.loss, "{:.6f}"));
  if (m.val_loss) line += fmt::format(R"("val_loss":{},)", num(*m.val_loss, "{:.6f}"));
  if (m.skipped) line += R"("skipped":true,)";
  line += fmt::format(R"("lr":{:.6e},"grad_norm":{},"tokens_per_s":{:.1f},"step_ms":{:.3f},"gflops":{:.3f},)", m.lr,
                      num(m.grad_norm, "{:.6f}"), m.tokens_per_s, m.step_ms, m.gflops);
  line += R"("mem_peak_bytes":{)";
  for (size_t i = 0; i < kNumMemCategories; ++i) {
    line += fmt::format(R"("{}":{},)", mem_category_name(static_cast<MemCategory>(i)), m.memory.peak[i]);
  }
  line += fmt::format(R"("total":{}}},"comm":{{)", m.memory.total_peak);
  for (size_t i = 0; i < kNumCommOps; ++i) {
    const CommOpStats& c = m.comm.ops[i];
    line += fmt::format(R"({}"{}":{{"calls":{},"elements":{},"bytes":{},"seconds":{:.6f}}})", i ? "," : "",
                        comm_op_name(static_cast<CommOp>(i)), c.calls, c.elements, c.bytes, c.seconds);
  }
  line += "}}";
  out_ << line << '\n';
  out_.flush();
  if (!out_) return Status::io_error("cannot write metrics file '" + path_ + "'");
  return Status::ok();
}

Progress::Progress(int64_t first_step, int64_t total_steps, int64_t interval, double tokens_per_step,
                   double flops_per_token, bool enabled, double peak_flops)
    : first_step_(first_step),
      total_(total_steps),
      interval_(interval),
      tokens_per_step_(tokens_per_step),
      flops_per_token_(flops_per_token),
      peak_flops_(peak_flops),
      enabled_(enabled),
      live_(enabled && ::isatty(STDERR_FILENO) != 0) {}

void Progress::clear_live() {
  if (!live_shown_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  live_shown_ = false;
}

void Progress::update(const StepMetrics& m) {
  if (!enabled_) return;
  const double s = m.step_ms / 1e3;
  elapsed_s_ += s;
  window_s_ += s;
  ++window_steps_;
  const double eta = elapsed_s_ / static_cast<double>(m.step - first_step_) * static_cast<double>(total_ - m.step);
  const std::string peak = format_bytes(m.memory.total_peak);
  if (m.step % interval_ == 0 || m.step == total_ || m.val_loss) {
    clear_live();
    const double tok_s = tokens_per_step_ * static_cast<double>(window_steps_) / window_s_;
    spdlog::info(
        "step {:>{}}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.1f} ms | {:.0f} tok/s | {:.1f} GFLOP/s{} | "
        "mem {} | ETA {}",
        m.step, std::to_string(total_).size(), total_, m.loss,
        m.val_loss ? fmt::format(" | val {:.4f}", *m.val_loss) : "", m.lr, m.grad_norm,
        window_s_ / static_cast<double>(window_steps_) * 1e3, tok_s, flops_per_token_ * tok_s / 1e9,
        peak_flops_ > 0 ? fmt::format(" | MFU {:.1f}%", 100.0 * flops_per_token_ * tok_s / peak_flops_) : "", peak,
        format_duration(eta));
    window_s_ = 0.0;
    window_steps_ = 0;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (live_ && now - last_live_ >= std::chrono::milliseconds(100)) {  // at most 10 redraws a second
    last_live_ = now;
    std::fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.4f | %.1f ms | %.0f tok/s | mem %s | ETA %s",
                 static_cast<long long>(m.step), static_cast<long long>(total_), m.loss, m.step_ms, m.tokens_per_s,
                 peak.c_str(), format_duration(eta).c_str());
    std::fflush(stderr);
    live_shown_ = true;
  }
}

Status write_run_summary(const std::string& path, const RunSummary& s) {
  std::string j = fmt::format(
      "{{\n  \"steps_done\": {},\n  \"total_steps\": {},\n  \"steps_this_run\": {},\n  \"interrupted\": {},\n"
      "  \"final_loss\": {},\n  \"final_val_loss\": {},\n  \"seconds\": {:.3f},\n  \"train_seconds\": {:.3f},\n"
      "  \"tokens_per_s\": {:.1f},\n"
      "  \"gflops\": {:.3f},\n  \"mfu\": {},\n  \"strategy\": \"{}\",\n  \"world_size\": {},\n  \"model_dir\": {},\n"
      "  \"latest_checkpoint\": {},\n  \"mem_peak_bytes\": ",
      s.steps_done, s.total_steps, s.steps_this_run, s.interrupted, num(s.final_loss, "{:.6f}"),
      s.final_val_loss ? num(*s.final_val_loss, "{:.6f}") : "null", s.seconds, s.train_seconds, s.tokens_per_s, s.gflops,
      s.mfu ? num(*s.mfu, "{:.4f}") : "null", s.strategy, s.world_size,
      s.model_dir.empty() ? "null" : "\"" + s.model_dir + "\"",
      s.latest_checkpoint.empty() ? "null" : "\"" + s.latest_checkpoint + "\"");
  // {"params": ..., one per category, "total": ...}
  auto by_category = [](const std::array<int64_t, kNumMemCategories>& bytes, int64_t total) {
    std::string o = "{";
    for (size_t i = 0; i < kNumMemCategories; ++i) {
      o += fmt::format("\"{}\": {}, ", mem_category_name(static_cast<MemCategory>(i)), bytes[i]);
    }
    return o + fmt::format("\"total\": {}}}", total);
  };
  j += by_category(s.memory.peak, s.memory.total_peak) + ",\n  \"mem_planned_bytes\": ";
  if (s.mem_planned) {
    int64_t total = 0;
    for (const int64_t bytes : *s.mem_planned) total += bytes;
    j += by_category(*s.mem_planned, total);
  } else {
    j += "null";
  }
  j += ",\n  \"device_memory_bytes\": ";
  if (s.device_in_use_bytes) {
    const int64_t untracked = *s.device_in_use_bytes - s.device_tracked_bytes;
    j += fmt::format(
        "{{\"in_use\": {}, \"tracked\": {}, \"untracked\": {}, \"untracked_at_start\": {}, "
        "\"untracked_since_start\": {}}}",
        *s.device_in_use_bytes, s.device_tracked_bytes, untracked, s.device_untracked_at_start,
        untracked - s.device_untracked_at_start);
  } else {
    j += "null";
  }
  j += ",\n  \"comm\": {";
  for (size_t i = 0; i < kNumCommOps; ++i) {
    const CommOpStats& c = s.comm.ops[i];
    j += fmt::format("{}\"{}\": {{\"calls\": {}, \"elements\": {}, \"bytes\": {}, \"seconds\": {:.6f}}}", i ? ", " : "",
                     comm_op_name(static_cast<CommOp>(i)), c.calls, c.elements, c.bytes, c.seconds);
  }
  j += "}\n}\n";
  return write_file_atomically(path, {std::span<const char>(j)});
}

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace gpt
