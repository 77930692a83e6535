#include "comm/comm_stream.h"

#include <chrono>

#include "core/test_fault.h"

namespace gpt {

namespace {

// Test hook skip_collective:<rank>:<seq>: that rank silently drops the world group's collective <seq>, as a
// rank that took another branch would, and its next collective then never completes, as a mismatched
// collective does under NCCL (MPI may instead match mismatched collectives silently and fail later)
// (tests/apps/comm_watchdog_test.sh). The number to skip, or 0.
uint64_t seq_to_skip(const std::string& group, int rank) {
  const std::optional<TestFault> f = test_fault();
  if (group != "world" || !f || !f->is("skip_collective", 2) || f->args[0] != rank || f->args[1] <= 0) return 0;
  return static_cast<uint64_t>(f->args[1]);
}

}  // namespace

CommStream::CommStream(std::string group, int rank)
    : group_(std::move(group)), rank_(rank), skip_seq_(seq_to_skip(group_, rank_)), thread_([this] { loop(); }) {}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Work CommStream::submit(CommOp op, int64_t elements, int64_t bytes, std::function<void()> task,
                        std::function<void()> device_join) {
  auto state = std::make_shared<Work::State>();
  state->device_join = std::move(device_join);
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = ++submitted_;
    if (seq == skip_seq_) {
      --submitted_;  // the next collective takes this number
      skip_seq_ = 0;
      stall_next_ = true;
      return Work();
    }
    if (stall_next_) {
      stall_next_ = false;
      task = [] {
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      };
    }
    history_.push_back({group_, seq, op, elements, false});
    if (history_.size() > kHistory) history_.pop_front();
    queue_.push_back({op, elements, bytes, std::move(task), state, true, seq});
  }
  cv_.notify_all();
  return Work(state);
}

std::vector<CollectiveRecord> CommStream::history() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {history_.begin(), history_.end()};
}

std::optional<double> CommStream::running_for() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<std::chrono::steady_clock::time_point> since = running_since_;
  if (host_since_ && (!since || *host_since_ < *since)) since = host_since_;
  if (!since) return std::nullopt;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - *since).count();
}

CommStream::HostCall CommStream::host_call(const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  host_since_ = std::chrono::steady_clock::now();
  host_what_ = what;
  return HostCall(this);
}

CommStream::HostCall::~HostCall() {
  std::lock_guard<std::mutex> lock(stream_->mu_);
  stream_->host_since_.reset();
  stream_->host_what_ = nullptr;
}

const char* CommStream::blocked_in() const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_what_;
}

void CommStream::run_sync(std::function<void()> task) {
  auto state = std::make_shared<Work::State>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({CommOp::kBarrier, 0, 0, std::move(task), state, false, 0});
  }
  cv_.notify_all();
  Work(state).wait();
}

CommStats CommStream::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CommStream::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      running_since_ = std::chrono::steady_clock::now();
    }
    const auto t0 = std::chrono::steady_clock::now();
    task.fn();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_since_.reset();
      for (CollectiveRecord& r : history_) {
        if (task.counted && r.seq == task.seq) r.done = true;
      }
      if (task.counted) {
        CommOpStats& s = stats_.ops[static_cast<size_t>(task.op)];
        ++s.calls;
        s.elements += task.elements;
        s.bytes += task.bytes;
        s.seconds += seconds;
        ++stats_.last_seq;
      }
    }
    {
      std::lock_guard<std::mutex> lock(task.state->mu);
      task.state->done = true;
    }
    task.state->cv.notify_all();
  }
}

}  // namespace gpt
