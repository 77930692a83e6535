#include "train/trainer.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string_view>
#include <thread>

#include "checkpoint/manifest.h"
#include "config/loader.h"
#include "core/stop_signal.h"
#include "core/test_fault.h"
#include "train/metrics.h"

namespace gpt {

namespace fs = std::filesystem;

namespace {

// Whether the run in `out_dir` finished at step `steps`: its final model (manifest.json of out_dir/model, written
// after the last checkpoint) is at that step and its summary.json, written last, is there.
bool run_finished_on_disk(const fs::path& out_dir, int64_t steps) {
  std::error_code ec;
  if (!fs::exists(out_dir / "summary.json", ec)) return false;
  std::ifstream in(out_dir / "model" / "manifest.json", std::ios::binary);
  if (!in) return false;
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  const Expected<Manifest> m = parse_manifest(text, (out_dir / "model" / "manifest.json").string());
  return m && m->step >= steps;
}
}  // namespace

Trainer::~Trainer() {
  if (save_thread_.joinable()) save_thread_.join();
}

double Trainer::peak_flops() const {
  return config_.logging.peak_tflops > 0 ? config_.logging.peak_tflops * 1e12 : backend_->peak_flops();
}

double Trainer::flops_per_token() const {
  const double n = static_cast<double>(shape_.num_params()) - static_cast<double>(shape_.block_size) * shape_.n_embd;
  const double L = shape_.n_layer, H = shape_.n_head, Q = shape_.n_embd / shape_.n_head, T = shape_.block_size;
  return 6.0 * n + 12.0 * L * H * Q * T;
}

int Trainer::first_nonfinite_unit() {
  const int n = static_cast<int>(model_->layout().units.size());
  std::vector<float> bad(static_cast<size_t>(n), 0.0f);
  for (const MasterRegion& r : params_->regions()) {
    // A sum of squares is non-finite when an element is (or when one exceeds ~1e19, as bad a gradient).
    if (r.length > 0 && !std::isfinite(backend_->sum_squares(params_->local_grads() + r.local_offset, r.length))) {
      bad[static_cast<size_t>(r.unit)] = 1.0f;
    }
  }
  if (world_.size() > 1) world_.all_reduce(bad.data(), n, DType::kF32).wait();
  for (int u = 0; u < n; ++u) {
    if (bad[static_cast<size_t>(u)] > 0.0f) return u;
  }
  return -1;
}

namespace {

// Test hook nan_grad:<step>:<unit> puts a NaN into that unit's gradient at that step (1-based), on every
// rank that holds part of it, as an overflow in backward would.
void maybe_inject_nan(const std::optional<TestFault>& fault, int64_t step, ShardedParams& params, Backend& be) {
  if (!fault || !fault->is("nan_grad", 2) || fault->args[0] != step) return;
  const float nan = std::nanf("");
  for (const MasterRegion& r : params.regions()) {
    if (r.unit == fault->args[1] && r.length > 0) {
      be.to_device(const_cast<float*>(params.local_grads()) + r.local_offset, &nan, sizeof(float));
    }
  }
}

// Test hook hang:<rank>:<step> makes that rank stop at the start of that step (1-based) without entering a
// collective, as a rank stuck in I/O or a deadlock of its own would.
// stop:<rank>:<step> stops that whole process there (SIGSTOP: its watchdog too), as a rank whose node froze would.
void maybe_hang(const std::optional<TestFault>& fault, int64_t step, int rank) {
  if (fault && fault->is("stop", 2) && fault->args[0] == rank && fault->args[1] == step) ::raise(SIGSTOP);
  if (!fault || !fault->is("hang", 2) || fault->args[0] != rank || fault->args[1] != step) return;
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

Expected<float> Trainer::train_step(int64_t step) {
  maybe_hang(fault_, step + 1, world_.rank());
  const int B = config_.training.micro_batch_size;
  const int64_t accum = rows_per_rank_ / B;  // micro-batches on this rank
  const float loss_scale = 1.0f / static_cast<float>(config_.global_batch() * shape_.block_size);
  const uint64_t batch = train_.next_batch_index();
  const int64_t first_row = world_.rank() * rows_per_rank_;
  for (int64_t micro = 0; micro < accum; ++micro) {
    const int64_t row = first_row + micro * B;
    train_.fill_rows(batch, row, B, inputs_.data(), targets_.data());
    params_->begin_micro_batch(micro == 0, micro + 1 == accum);
    const StepContext ctx{config_.run.seed, step, row, true};
    model_->forward_backward_into(*params_, inputs_.data(), targets_.data(), loss_scale, ctx, static_cast<int>(micro));
  }
  // The gradients first: finish_grads launches the last bucket's collective at once, and the norm waits for all
  // of them; the losses are read after that, from an idle GPU, so that a step waits for the device once, not
  // also before the last collective has started.
  params_->finish_grads();
  maybe_inject_nan(fault_, step + 1, *params_, *backend_);
  last_grad_norm_ = std::sqrt(params_->grad_sq_norm());
  float loss_sum = 0.0f;  // in micro-batch order
  for (const float micro_loss : model_->mean_losses(static_cast<int>(accum))) loss_sum += micro_loss;
  // The step's loss: the mean over every micro-batch of every rank. With it, whether any rank has been asked
  // to stop (SIGUSR1/SIGTERM/SIGINT), so that all stop after this step.
  float sums[2] = {loss_sum, stop_signal() != 0 ? 1.0f : 0.0f};
  if (world_.size() > 1) world_.all_reduce(sums, 2, DType::kF32).wait();
  stop_requested_ = sums[1] > 0.0f;
  const float loss = sums[0] / static_cast<float>(config_.grad_accum_steps());
  step_skipped_ = false;
  if (!std::isfinite(loss) || !std::isfinite(last_grad_norm_)) {
    const int unit = first_nonfinite_unit();
    const std::string what = fmt::format(
        "step {}: loss {}, gradient norm {}; {}", step + 1, loss, last_grad_norm_,
        unit >= 0 ? "the first unit with a non-finite gradient is '" + model_->layout().units[unit].name + "'"
                  : std::string("no gradient element is non-finite (the norm overflowed)"));
    if (config_.training.nonfinite == "stop") {
      return Status::failed_precondition(what + " (training.nonfinite: stop; lower training.lr, clip harder with " +
                                         "training.grad_clip, or set training.nonfinite: skip_step)");
    }
    if (world_.rank() == 0) spdlog::warn("{}: update skipped (training.nonfinite: skip_step)", what);  // all alike
    step_skipped_ = true;
    return loss;
  }
  const float scale = clip_scale(last_grad_norm_, config_.training.grad_clip);
  // The bf16 parameters are written by the optimizer's pass itself, rounded as publish would at this step.
  optimizer_->step(params_->master(), params_->local_grads(), schedule_.at(step), scale, params_->master_lo(),
                   params_->rounding(optimizer_->steps_taken() + 1));
  params_->publish(optimizer_->steps_taken(), /*lo_written=*/true);
  return loss;
}

void Trainer::log_planned_vs_measured(TrainSummary& summary) const {
  const MemStats m = MemTracker::instance().stats();
  const std::pair<MemCategory, int64_t> rows[] = {
      {MemCategory::kParams, plan_.params},           {MemCategory::kGrads, plan_.grads},
      {MemCategory::kMaster, plan_.master},           {MemCategory::kOptimizer, plan_.optimizer},
      {MemCategory::kActivations, plan_.activations}, {MemCategory::kWorkspace, plan_.workspace},
      {MemCategory::kComm, plan_.comm_buffers}};
  std::string table;
  for (const auto& [category, planned] : rows) {
    const auto c = static_cast<size_t>(category);
    summary.planned_bytes[c] = planned;
    summary.measured_bytes[c] = m.peak[c];
    table += fmt::format("\n  {:<12} planned {:>12}  measured {:>12}", mem_category_name(category),
                         format_bytes(planned), format_bytes(m.peak[c]));
  }
  if (world_.rank() == 0) spdlog::info("memory per rank after step 1 ({}):{}", plan_.name(), table);
}

void Trainer::log_device_memory(TrainSummary& summary) const {
  summary.device_in_use_bytes = backend_->device_memory_in_use();
  if (!summary.device_in_use_bytes) return;
  const MemStats m = MemTracker::instance().stats();
  summary.device_tracked_bytes = m.total_current;
  summary.device_tracked_buffers = m.live_buffers;
  summary.device_untracked_at_start = device_untracked_at_start_;
  if (world_.rank() != 0) return;
  const int64_t untracked = *summary.device_in_use_bytes - summary.device_tracked_bytes;
  const int64_t since_start = untracked - device_untracked_at_start_;
  const int64_t reserve = device_memory_reserve_bytes(config_.parallel);
  spdlog::info(
      "device memory after step 1: {} in use (the driver's total - free), {} of it gpt-train's buffers; the other {}: "
      "the CUDA context, cuBLAS(Lt), NCCL's own buffers and allocation rounding, which the plan does not count; {} "
      "of that was there at the start, {} came since (parallel.device_memory_reserve_gb keeps {} for it)",
      format_bytes(*summary.device_in_use_bytes), format_bytes(summary.device_tracked_bytes), format_bytes(untracked),
      format_bytes(device_untracked_at_start_), format_bytes(since_start), format_bytes(reserve));
  if (since_start > reserve) {
    spdlog::warn(
        "device memory: {} was allocated outside the plan after the start, more than parallel.device_memory_reserve_gb "
        "({}); a plan that fills the GPU may run out of memory: raise it to at least {:.2f}",
        format_bytes(since_start), format_bytes(reserve), static_cast<double>(since_start) / 1e9);
  }
}

std::string Trainer::strategy_label() const {
  const std::string inner(strategy_name(params_->strategy()));
  return replicate_group_ ? "hybrid:" + inner : inner;
}

Status Trainer::write_summary(const TrainSummary& summary, int64_t steps_done, const std::string& model_dir) {
  if (world_.rank() != 0) return Status::ok();
  RunSummary s;
  s.steps_done = steps_done;
  s.total_steps = config_.training.steps;
  s.steps_this_run = summary.steps;
  s.interrupted = summary.interrupted;
  s.final_loss = summary.final_loss;
  s.final_val_loss = summary.final_val_loss;
  s.seconds = summary.seconds;
  s.train_seconds = summary.train_seconds;
  s.tokens_per_s = summary.tokens_per_s;
  s.gflops = flops_per_token() * summary.tokens_per_s / 1e9;
  if (peak_flops() > 0) s.mfu = s.gflops * 1e9 / (peak_flops() * world_.size());
  s.strategy = strategy_label();
  s.world_size = world_.size();
  s.memory = MemTracker::instance().stats();
  if (summary.steps > 0) s.mem_planned = summary.planned_bytes;
  s.device_in_use_bytes = summary.device_in_use_bytes;
  s.device_tracked_bytes = summary.device_tracked_bytes;
  s.device_untracked_at_start = summary.device_untracked_at_start;
  s.comm = comm_stats();
  s.model_dir = model_dir;
  s.latest_checkpoint = latest_checkpoint(checkpoint_root());
  return write_run_summary((std::filesystem::path(config_.run.out_dir) / "summary.json").string(), s);
}

CommStats Trainer::comm_stats() const {
  CommStats total = world_.stats();
  for (const auto* group :
       {shard_group_.get(), replicate_group_.get(), device_shard_group_.get(), device_replicate_group_.get()}) {
    if (group == nullptr) continue;
    const CommStats s = group->stats();
    for (size_t i = 0; i < kNumCommOps; ++i) {
      total.ops[i].calls += s.ops[i].calls;
      total.ops[i].elements += s.ops[i].elements;
      total.ops[i].bytes += s.ops[i].bytes;
      total.ops[i].seconds += s.ops[i].seconds;
    }
    total.last_seq += s.last_seq;
  }
  return total;
}

std::optional<float> Trainer::evaluate() {
  if (!val_) return std::nullopt;
  // The eval_batches micro-batches are dealt out over the ranks, batch k to rank k % W in round k / W, so an
  // evaluation costs each rank ceil(E / W) forwards instead of E. Every rank runs the same number of forwards
  // (the sharded strategies gather parameters inside the forward): a rank past the last batch in the final
  // round recomputes batch 0 and drops it. The per-batch losses are then gathered and summed in batch order,
  // exactly the single-process sum, so the mean is the same to the bit as one rank computing every batch.
  const int B = config_.training.micro_batch_size;
  const int E = config_.training.eval_batches;
  const int W = world_.size(), r = world_.rank();
  const int rounds = (E + W - 1) / W;
  std::vector<float> mine(static_cast<size_t>(rounds)), all(static_cast<size_t>(rounds) * W);
  for (int i = 0; i < rounds; ++i) {
    const int k = i * W + r;
    val_->fill_rows(static_cast<uint64_t>(k < E ? k : 0), 0, B, inputs_.data(), targets_.data());
    mine[i] =
        model_->forward_loss(*params_, inputs_.data(), targets_.data(), StepContext{config_.run.seed, 0, 0, false});
  }
  world_.all_gather(mine.data(), all.data(), rounds, DType::kF32).wait();
  double sum = 0.0;
  for (int k = 0; k < E; ++k) sum += all[static_cast<size_t>(k % W) * rounds + k / W];
  return static_cast<float>(sum / E);
}

Expected<TrainSummary> Trainer::run() {
  auto summary = run_steps();
  // Taken at the last step before its evaluation; a run stopped early (a signal, an error) reports what it ran, and
  // one that had nothing to train (resumed at its end) nothing.
  if (profile_report_.empty() && !(summary && summary->steps == 0)) profile_report_ = backend_->profile_report();
  if (!profile_report_.empty() && world_.rank() == 0) spdlog::info("{}", profile_report_);
  // A save still being written in the background finishes (or fails) before the error ends the job, so the
  // newest checkpoint is not lost to an abort.
  if (!summary) (void)wait_for_save();
  return summary;
}

bool Trainer::run_finished(const fs::path& out_dir, int64_t steps) {
  int32_t finished = world_.rank() == 0 && run_finished_on_disk(out_dir, steps) ? 1 : 0;
  world_.broadcast(&finished, 1, DType::kI32, 0).wait();
  return finished != 0;
}

Expected<TrainSummary> Trainer::run_steps() {
  const auto& t = config_.training;
  const bool writer = world_.rank() == 0;
  const fs::path out_dir(config_.run.out_dir);
  if (start_step_ >= t.steps && start_step_ > 0 && run_finished(out_dir, t.steps)) {
    // Resumed at the end of a run that finished (submitted again, as a requeued job can be): its summary, metrics
    // and final model stay as the run left them. A run stopped between its last checkpoint and its final model
    // (killed while saving) goes on below: no step to take, but the model and summary are written.
    spdlog::info(
        "the run is complete: resumed at step {} of training.steps {}, nothing to train; {} is left as it "
        "is (raise training.steps to train on)",
        start_step_, t.steps, out_dir.string());
    return TrainSummary{};
  }
  std::optional<MetricsWriter> metrics;
  if (writer) {
    std::error_code ec;
    if (fs::exists(out_dir, ec) && !fs::is_directory(out_dir, ec)) {
      return Status::invalid_argument(config_.where("run.out_dir") + ": run.out_dir '" + out_dir.string() +
                                      "' is a file; expected a directory");
    }
    fs::create_directories(out_dir, ec);
    if (ec) {
      return Status::io_error(config_.where("run.out_dir") + ": cannot create run.out_dir '" + out_dir.string() +
                              "': " + ec.message());
    }
    std::ofstream f(out_dir / "config.yaml");
    f << to_yaml(config_);
    if (!f) return Status::io_error("cannot write '" + (out_dir / "config.yaml").string() + "'");
    GPT_ASSIGN_OR_RETURN(MetricsWriter m,
                         MetricsWriter::open((out_dir / config_.logging.metrics_file).string(), start_step_));
    metrics.emplace(std::move(m));
  }
  spdlog::info("model: {} layers, {} heads, {} wide, block {}, vocab {}: {:.2f}M parameters", shape_.n_layer,
               shape_.n_head, shape_.n_embd, shape_.block_size, shape_.vocab_size, shape_.num_params() / 1e6);
  spdlog::info(
      "batch: {} sequences x {} tokens per step over {} rank(s), {} micro-batches of {} per rank; {} steps; "
      "strategy {}; activation checkpointing {}",
      config_.global_batch(), shape_.block_size, world_.size(), rows_per_rank_ / t.micro_batch_size, t.micro_batch_size,
      t.steps,
      replicate_group_ ? fmt::format("hybrid ({} replicas x {}-rank {} shard groups)", replicate_group_->size(),
                                     shard_group_->size(), strategy_name(params_->strategy()))
                       : std::string(strategy_name(params_->strategy())),
      t.activation_checkpointing);

  TrainSummary summary;
  const double tokens_per_step = static_cast<double>(config_.global_batch()) * shape_.block_size;
  const auto start = std::chrono::steady_clock::now();
  Progress progress(start_step_, t.steps, config_.logging.log_interval, tokens_per_step, flops_per_token(), writer,
                    peak_flops() * world_.size());
  int64_t allocations_at_first_step = MemTracker::instance().stats().allocations;  // reset after step 1
  auto count_late_allocations = [&] {
    summary.allocations_after_first_step = MemTracker::instance().stats().allocations - allocations_at_first_step;
    if (summary.allocations_after_first_step > 0) {
      spdlog::warn("{} tracked allocations after the first step (the pools should have been sized up front)",
                   summary.allocations_after_first_step);
    }
  };
  for (int64_t step = start_step_; step < t.steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    GPT_ASSIGN_OR_RETURN(const float loss, train_step(step));
    if (step == start_step_) allocations_at_first_step = MemTracker::instance().stats().allocations;
    const double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    summary.train_seconds += step_s;
    summary.final_loss = loss;
    summary.losses.push_back(loss);
    if (step == start_step_) {
      progress.clear_live();
      log_planned_vs_measured(summary);
      log_device_memory(summary);
      // The profile (GPT_TRAIN_CUDA_PROFILE=1) times the steps after the first: that one also runs cuBLASLt's
      // heuristics and loads the kernels. A run of one step, or one stopping after it (a signal), keeps it.
      if (step + 1 < t.steps && !stop_requested_) backend_->profile_restart();
    }
    StepMetrics m;
    m.step = step + 1;
    m.loss = loss;
    m.lr = schedule_.at(step);
    m.grad_norm = last_grad_norm_;
    m.skipped = step_skipped_;
    m.step_ms = step_s * 1e3;
    m.tokens_per_s = tokens_per_step / step_s;
    m.gflops = flops_per_token() * m.tokens_per_s / 1e9;
    const bool last = step + 1 == t.steps;
    if (last) profile_report_ = backend_->profile_report();  // the training steps' ops, before the final eval
    if (val_ && ((t.eval_interval > 0 && (step + 1) % t.eval_interval == 0) || last)) {
      m.val_loss = evaluate();
      summary.final_val_loss = m.val_loss;
    }
    m.memory = MemTracker::instance().stats();
    m.comm = comm_stats();
    if (metrics) GPT_RETURN_IF_ERROR(metrics->write(m));
    progress.update(m);
    const bool saved = config_.checkpoint.every > 0 && ((step + 1) % config_.checkpoint.every == 0 || last);
    if (saved) {
      progress.clear_live();
      GPT_RETURN_IF_ERROR(save(step + 1, /*model_only=*/false));
    }
    if (stop_requested_ && !last) {
      progress.clear_live();
      if (!saved) GPT_RETURN_IF_ERROR(save(step + 1, /*model_only=*/false));
      GPT_RETURN_IF_ERROR(wait_for_save());
      const int sig = stop_signal();
      spdlog::info("{}: checkpoint saved after signal at step {}/{} in {}; exiting, --resume auto continues from it",
                   sig != 0 ? std::string(stop_signal_name(sig)) + " received" : "another rank was signalled", step + 1,
                   t.steps, checkpoint_root());
      summary.interrupted = true;
      count_late_allocations();
      summary.steps = step + 1 - start_step_;
      summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      summary.tokens_per_s = tokens_per_step * static_cast<double>(summary.steps) / summary.train_seconds;
      GPT_RETURN_IF_ERROR(write_summary(summary, step + 1, ""));
      return summary;
    }
  }
  summary.steps = t.steps - start_step_;
  count_late_allocations();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  summary.tokens_per_s = tokens_per_step * static_cast<double>(summary.steps) / summary.train_seconds;
  const std::string model_dir = (out_dir / "model").string();
  GPT_RETURN_IF_ERROR(wait_for_save());
  GPT_RETURN_IF_ERROR(save(t.steps, /*model_only=*/true));
  GPT_RETURN_IF_ERROR(write_summary(summary, t.steps, model_dir));
  spdlog::info("done: {} steps in {}, final loss {:.4f}{}; weights saved to {}", t.steps,
               format_duration(summary.seconds), summary.final_loss,
               summary.final_val_loss ? fmt::format(", val loss {:.4f}", *summary.final_val_loss) : "", model_dir);
  return summary;
}

}  // namespace gpt
