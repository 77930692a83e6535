#include "train/metrics.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>

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
  w.out_.open(path, std::ios::out | std::ios::trunc);
  w.out_ << kept;
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

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace gpt
