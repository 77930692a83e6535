#include "comm/comm_stream.h"

#include <chrono>

namespace gpt {

CommStream::CommStream() : thread_([this] { loop(); }) {}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Work CommStream::submit(CommOp op, int64_t elements, int64_t bytes, std::function<void()> task) {
  auto state = std::make_shared<Work::State>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({op, elements, bytes, std::move(task), state, true});
  }
  cv_.notify_all();
  return Work(state);
}

void CommStream::run_sync(std::function<void()> task) {
  auto state = std::make_shared<Work::State>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back({CommOp::kBarrier, 0, 0, std::move(task), state, false});
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
    }
    const auto t0 = std::chrono::steady_clock::now();
    task.fn();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
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
