// Communicator: collectives over a group of ranks (PyTorch c10d's shape). Every call is issued in the same
// order on every rank of the group and returns a Work to wait on; collectives run asynchronously, in
// issue order, on the communicator's own comm stream (a thread for MPI, a CUDA stream for NCCL), so
// communication overlaps compute. Reductions are sums. Buffers must stay valid, and must not be touched
// by the caller, until the Work completes (`// *buf must outlive the Work`).
//
// Two ways to wait. wait(): the host blocks until the collective is done (for host values, and before
// reading a result on the host). join(): later work of the caller's compute stream is ordered after the
// collective; for device buffers (NCCL) that is a wait enqueued on the GPU (cudaStreamWaitEvent) and the host
// goes on at once, so the host keeps queueing kernels while communication runs (PyTorch's wait_stream);
// elsewhere it is wait(). After a join(), a buffer of the collective may go back to a pool: every later
// collective is itself ordered after the compute stream's work at issue, so it cannot overtake.
//
// Element types: f32 and bf16 (2-byte elements; the MPI communicator sums bf16 through fp32, NCCL's ring rounds
// each hop's partial sum to bf16: nccl_communicator.h).
// Every collective is numbered (seq) and counted per op: calls, elements, bytes and wall time on the comm
// stream, so a hang can name the collective and metrics can report communication volume.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/status.h"

namespace gpt {

enum class CommOp : uint8_t { kAllReduce, kReduceScatter, kAllGather, kBroadcast, kBarrier, kCount };
constexpr size_t kNumCommOps = static_cast<size_t>(CommOp::kCount);
std::string_view comm_op_name(CommOp op);

struct CommOpStats {
  int64_t calls = 0;
  int64_t elements = 0;  // per rank: the elements this rank contributes (all_gather: the gathered total)
  int64_t bytes = 0;
  double seconds = 0.0;  // wall time on the comm stream
};

struct CommStats {
  std::array<CommOpStats, kNumCommOps> ops{};
  uint64_t last_seq = 0;
};

// Completion of one collective. Cheap to copy; wait() may be called any number of times.
class Work {
 public:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    // Set once, before the Work is handed out: what join() enqueues instead of waiting (NCCL), or empty.
    std::function<void()> device_join;
  };
  Work() = default;  // an already-completed Work
  explicit Work(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void wait() const;
  // The caller's compute stream waits for the collective (on the device, without blocking the host, where
  // the communicator supports it; else wait()).
  void join() const;
  bool is_done() const;

 private:
  std::shared_ptr<State> state_;
};

class CommWatchdog;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's role in the mesh: "world", "shard.<i>", "replicate.<j>" (i, j: which group of that kind).
  virtual std::string_view group_name() const = 0;
  // The collective watchdog watching this communicator's collectives, if any: a communicator built on top of
  // this one (NCCL over MPI) registers its own stream with it.
  virtual CommWatchdog* watchdog() const { return nullptr; }

  // buf(n) <- sum over ranks of buf(n). In place.
  virtual Work all_reduce(void* buf, int64_t n, DType dtype) = 0;
  // recv(n) <- sum over ranks of block `rank()` of send(size()*n). send and recv must not overlap.
  virtual Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) = 0;
  // recv(size()*n) <- concatenation over ranks of send(n); send may be recv's own block (in place).
  virtual Work all_gather(const void* send, void* recv, int64_t n, DType dtype) = 0;
  // buf(n) <- root's buf(n).
  virtual Work broadcast(void* buf, int64_t n, DType dtype, int root) = 0;
  virtual Work barrier() = 0;

  // A sub-group of this group: ranks with equal `color` form one group, ordered by `key`. Collective:
  // every rank of this group calls it, in the same order relative to other collectives.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

  // Snapshot of the counters (thread-safe).
  virtual CommStats stats() const = 0;
};

// The single-process communicator: a group of one. Collectives are copies; counted like the others.
std::unique_ptr<Communicator> make_single_communicator(std::string name = "world");

// Every rank of `group` learns whether any rank failed a step each took on its own (writing or reading its
// checkpoint shards): returns `local` where that failed, else "<what> failed on rank R (its log has the cause)"
// naming the first rank that failed, with that rank's status code (so every rank exits alike), else ok. Collective (a
// host all_gather: `group` carries host memory). So the ranks go on, or return, together: one that returned alone would
// leave the others waiting in their next collective, and on GPUs in NCCL's teardown, which waits for the node's other
// ranks.
Status agree(Communicator& group, const Status& local, const std::string& what);

// Rank 0's `text` on every rank of `group` (so that all ranks act alike even where their file systems differ).
// Collective (host broadcasts).
std::string broadcast_string(Communicator& group, std::string text);

}  // namespace gpt
