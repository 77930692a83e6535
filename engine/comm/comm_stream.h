// CommStream: the in-order stream that collectives of one communicator run on. A dedicated thread takes
// submitted tasks in submission order, runs each, times it and marks its Work done; so the caller's
// thread goes on computing while communication proceeds (the CPU analogue of an NCCL stream).
// Thread-safe: submit() and stats() may be called from any thread; tasks never run concurrently.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"

namespace gpt {

// One collective as the watchdog reports it: its number in this communicator (1-based, in issue order), what
// it was, and whether it had completed.
struct CollectiveRecord {
  std::string group;
  uint64_t seq = 0;
  CommOp op = CommOp::kBarrier;
  int64_t elements = 0;
  bool done = false;
};

class CommStream {
 public:
  static constexpr size_t kHistory = 20;  // collectives remembered for a hang report
  // `group` and `rank` name the communicator in reports (and let the test hook GPT_TRAIN_FAULT=
  // skip_collective:<rank>:<seq> drop the world group's collective number <seq> on one rank).
  explicit CommStream(std::string group = "", int rank = -1);
  ~CommStream();  // drains the queue, then joins the thread
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `task`; the returned Work completes when it has run. Counted under `op`. `device_join`: what the
  // Work's join() does instead of waiting (see Work::State), or empty.
  Work submit(CommOp op, int64_t elements, int64_t bytes, std::function<void()> task,
              std::function<void()> device_join = {});
  // Runs `task` on the stream and waits for it (for calls that must happen in stream order, e.g. split).
  void run_sync(std::function<void()> task);
  CommStats stats() const;
  // The last kHistory collectives submitted, oldest first.
  std::vector<CollectiveRecord> history() const;
  // How long the collective running now has been running, if one is (or the host call in progress, if longer).
  std::optional<double> running_for() const;

  // A call on the caller's thread that waits for the peers to take part (NCCL's ncclCommInitRank, a launch that
  // sets up connections, ncclCommDestroy): while the guard lives, running_for() counts it as a running collective,
  // so the watchdog reports a rank stuck in it instead of the job hanging; `what` (a string literal) names it.
  class HostCall {
   public:
    ~HostCall();
    HostCall(const HostCall&) = delete;
    HostCall& operator=(const HostCall&) = delete;

   private:
    friend class CommStream;
    explicit HostCall(CommStream* s) : stream_(s) {}
    CommStream* stream_;
  };
  [[nodiscard]] HostCall host_call(const char* what);
  // The host call in progress, or null.
  const char* blocked_in() const;
  const std::string& group() const { return group_; }

 private:
  struct Task {
    CommOp op;
    int64_t elements, bytes;
    std::function<void()> fn;
    std::shared_ptr<Work::State> state;
    bool counted;
    uint64_t seq;
  };
  void loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stopping_ = false;
  CommStats stats_;
  std::string group_;
  int rank_;
  uint64_t submitted_ = 0;
  uint64_t skip_seq_;        // the skip_collective test hook: the collective to drop (0: none)
  bool stall_next_ = false;  // ... after which the next one never completes
  std::deque<CollectiveRecord> history_;
  std::optional<std::chrono::steady_clock::time_point> running_since_;
  std::optional<std::chrono::steady_clock::time_point> host_since_;  // host_call's
  const char* host_what_ = nullptr;
  std::thread thread_;
};

}  // namespace gpt
