// CommStream: the in-order stream that collectives of one communicator run on. A dedicated thread takes
// submitted tasks in submission order, runs each, times it and marks its Work done; so the caller's
// thread goes on computing while communication proceeds (the CPU analogue of an NCCL stream).
// Thread-safe: submit() and stats() may be called from any thread; tasks never run concurrently.
#pragma once

#include <deque>
#include <functional>
#include <thread>

#include "comm/communicator.h"

namespace gpt {

class CommStream {
 public:
  CommStream();
  ~CommStream();  // drains the queue, then joins the thread
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `task`; the returned Work completes when it has run. Counted under `op`.
  Work submit(CommOp op, int64_t elements, int64_t bytes, std::function<void()> task);
  // Runs `task` on the stream and waits for it (for calls that must happen in stream order, e.g. split).
  void run_sync(std::function<void()> task);
  CommStats stats() const;

 private:
  struct Task {
    CommOp op;
    int64_t elements, bytes;
    std::function<void()> fn;
    std::shared_ptr<Work::State> state;
    bool counted;
  };
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  CommStats stats_;
  std::thread thread_;
};

}  // namespace gpt
