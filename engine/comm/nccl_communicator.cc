#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>  // gethostname

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_stream.h"
#include "comm/watchdog.h"
#include "core/check.h"
#include "kernels/cuda/cuda_check.h"

#define GPT_NCCL_CHECK(call)                                                                                    \
  do {                                                                                                          \
    const ncclResult_t gpt_res_ = (call);                                                                       \
    GPT_CHECK_MSG(gpt_res_ == ncclSuccess, (std::string(#call) + ": " + ncclGetErrorString(gpt_res_)).c_str()); \
  } while (0)

namespace gpt {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kU16:
      break;
  }
  GPT_CHECK_MSG(false, "NCCL has no 16-bit unsigned type: move u16 data as bytes");
  return ncclUint8;
}

// The NCCL call each CommOp launches (in CommOp's order), as a watchdog report names it.
constexpr const char* kNcclCall[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclBroadcast",
                                     "ncclAllReduce (barrier)"};
static_assert(std::size(kNcclCall) == kNumCommOps);

// One total order on the GPU for the collectives of all of a device's NCCL communicators (hybrid: the world, shard
// and replicate groups): each waits on the GPU for the one launched before it, on whichever communicator, so the
// GPU runs them in the host's launch order, the same on every rank. NCCL's user guide ("Using multiple NCCL
// communicators concurrently"): without such an order (stream dependencies, or since NCCL 2.26
// NCCL_LAUNCH_ORDER_IMPLICIT, off by default) collectives of two communicators on one device can deadlock.
struct LaunchOrder {
  std::mutex mu;
  std::map<int, cudaEvent_t> last;  // per device: recorded after the latest collective, on its comm stream
};
LaunchOrder& launch_order() {
  static LaunchOrder* order = new LaunchOrder;  // never destroyed: communicators may outlive static destruction
  return *order;
}

class NcclCommunicator final : public Communicator {
 public:
  // `tasks`: the comm stream its collectives are timed and recorded on, already watched by `bootstrap`'s
  // watchdog (if any) since before ncclCommInitRank.
  NcclCommunicator(Communicator& bootstrap, std::unique_ptr<Communicator> owned_bootstrap, int device,
                   cudaStream_t compute, ncclComm_t comm, std::string name, std::unique_ptr<CommStream> tasks)
      : bootstrap_(bootstrap),
        owned_bootstrap_(std::move(owned_bootstrap)),
        device_(device),
        compute_(compute),
        comm_(comm),
        name_(std::move(name)),
        tasks_(std::move(tasks)),
        watchdog_(bootstrap_.watchdog()) {
    GPT_CUDA_CHECK(cudaSetDevice(device_));
    GPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GPT_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(float)));
    GPT_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    GPT_NCCL_CHECK(ncclCommCount(comm_, &size_));
  }
  // Every step that can wait for the peers (the comm stream's last collectives, ncclCommDestroy) runs while the
  // watchdog still watches this communicator, so a peer that never gets there ends the job with a report, not a
  // hang on this rank.
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    {
      const CommStream::HostCall call = tasks_->host_call("cudaStreamSynchronize (NCCL teardown)");
      cudaStreamSynchronize(stream_);
    }
    tasks_->run_sync([] {});  // the queued waits end (their collectives are done)
    {
      const CommStream::HostCall call = tasks_->host_call("ncclCommDestroy");
      ncclCommDestroy(comm_);
    }
    if (watchdog_ != nullptr) watchdog_->unwatch(tasks_.get());
    tasks_.reset();
    cudaFree(barrier_buf_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view group_name() const override { return name_; }

  Work all_reduce(void* buf, int64_t n, DType dtype) override {
    return submit(CommOp::kAllReduce, n, n, dtype, [=, this] {
      GPT_NCCL_CHECK(ncclAllReduce(buf, buf, static_cast<size_t>(n), nccl_type(dtype), ncclSum, comm_, stream_));
    });
  }
  Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    return submit(CommOp::kReduceScatter, n * size_, n * size_, dtype, [=, this] {
      GPT_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(n), nccl_type(dtype), ncclSum, comm_, stream_));
    });
  }
  Work all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    return submit(CommOp::kAllGather, n * size_, n * size_, dtype, [=, this] {
      GPT_NCCL_CHECK(ncclAllGather(send, recv, static_cast<size_t>(n), nccl_type(dtype), comm_, stream_));
    });
  }
  Work broadcast(void* buf, int64_t n, DType dtype, int root) override {
    return submit(CommOp::kBroadcast, n, n, dtype, [=, this] {
      GPT_NCCL_CHECK(ncclBroadcast(buf, buf, static_cast<size_t>(n), nccl_type(dtype), root, comm_, stream_));
    });
  }
  Work barrier() override {
    return submit(CommOp::kBarrier, 0, 0, DType::kF32, [this] {
      GPT_NCCL_CHECK(ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclFloat32, ncclSum, comm_, stream_));
    });
  }
  // ncclCommSplit of this communicator (NCCL reuses its bootstrap: no new unique id to spread, no new socket
  // set-up, which takes long at scale; PyTorch's split_from does the same), with the bootstrap's split beside it
  // as the new communicator's own bootstrap (for its splits, and its collectives' watchdog names).
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    // NCCL takes a negative color as NCCL_SPLIT_NOCOLOR (no communicator back); every rank here joins a group.
    GPT_CHECK_MSG(color >= 0, ("split of '" + name_ + "': color " + std::to_string(color) + " is negative").c_str());
    std::unique_ptr<Communicator> sub = bootstrap_.split(color, key, name);
    GPT_CUDA_CHECK(cudaSetDevice(device_));
    {
      // Nothing of this communicator in flight while it splits.
      const CommStream::HostCall call = tasks_->host_call("cudaStreamSynchronize (before ncclCommSplit)");
      GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    // Watched, like ncclCommInitRank, while it waits for every rank to join.
    auto tasks = std::make_unique<CommStream>("nccl:" + name, sub->rank());
    CommWatchdog* watchdog = sub->watchdog();
    if (watchdog != nullptr) watchdog->watch(tasks.get());
    ncclComm_t comm = nullptr;
    ncclResult_t r;
    {
      const CommStream::HostCall call = tasks->host_call("ncclCommSplit");
      r = ncclCommSplit(comm_, color, key, &comm, nullptr);  // null config: the parent's
    }
    if (r != ncclSuccess) {
      if (watchdog != nullptr) watchdog->unwatch(tasks.get());
      GPT_CHECK_MSG(false, ("ncclCommSplit of '" + name_ + "' into '" + name + "' (rank " + std::to_string(rank_) +
                            " of " + std::to_string(size_) + "): " + ncclGetErrorString(r))
                               .c_str());
    }
    Communicator& boot = *sub;
    return std::make_unique<NcclCommunicator>(boot, std::move(sub), device_, compute_, comm, std::move(name),
                                              std::move(tasks));
  }
  CommStats stats() const override { return tasks_->stats(); }

 private:
  // The two events of one collective: `ready` on the compute stream at issue, `done` on the comm stream after
  // it. Shared by the CommStream task (which waits for `done`) and the Work's join() (which makes the compute
  // stream wait for it), so it lives until both are finished with it.
  struct Events {
    cudaEvent_t ready = nullptr, done = nullptr;
    Events() {
      GPT_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      GPT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    }
    ~Events() {
      cudaEventDestroy(ready);  // released once the GPU is past them (CUDA defers it)
      cudaEventDestroy(done);
    }
    Events(const Events&) = delete;
    Events& operator=(const Events&) = delete;
  };
  // Events of finished collectives, for the next ones: a step issues dozens of collectives under zero3, and each
  // would otherwise create (and destroy) two events on the host. A pair returns here when its last holder lets go:
  // the CommStream task has then seen `done` complete (so `ready`, which the comm stream waited for before the
  // collective, is complete too), and join(), if it ran, has enqueued its wait, which CUDA ties to the record
  // current at that call, so recording the pair again cannot move it. Shared with every pair it lent, so a Work
  // that outlives the communicator still has somewhere to return its events.
  struct EventPool {
    std::mutex mu;
    std::vector<std::unique_ptr<Events>> free;
  };
  std::shared_ptr<Events> take_events() {
    std::unique_ptr<Events> e;
    {
      std::lock_guard<std::mutex> lock(pool_->mu);
      if (!pool_->free.empty()) {
        e = std::move(pool_->free.back());
        pool_->free.pop_back();
      }
    }
    if (e == nullptr) e = std::make_unique<Events>();
    return std::shared_ptr<Events>(e.release(), [pool = pool_](Events* p) {
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->free.emplace_back(p);
    });
  }

  // Orders the collective after the compute stream's work so far and launches it on the comm stream. Its
  // Work completes when the GPU has finished it (the CommStream thread waits for `done`); its join() makes
  // the compute stream wait for `done` on the GPU, so the host need not block for compute to follow it.
  //
  // The NCCL kernel is launched here, on the calling thread, so kernels of all of a process's NCCL
  // communicators (hybrid: shard and replicate groups) are launched in issue order, the same order on every
  // rank, as PyTorch does; launching them from each communicator's own thread could order them differently on
  // different ranks, which NCCL documents as a possible deadlock. The CommStream thread only waits.
  Work submit(CommOp op, int64_t elements, int64_t n, DType dtype, const std::function<void()>& enqueue) {
    GPT_CUDA_CHECK(cudaSetDevice(device_));
    std::shared_ptr<Events> events = take_events();
    GPT_CUDA_CHECK(cudaEventRecord(events->ready, compute_));
    GPT_CUDA_CHECK(cudaStreamWaitEvent(stream_, events->ready, 0));
    {
      LaunchOrder& order = launch_order();
      std::lock_guard<std::mutex> ordered(order.mu);
      cudaEvent_t& last = order.last[device_];
      if (last == nullptr) {
        GPT_CUDA_CHECK(cudaEventCreateWithFlags(&last, cudaEventDisableTiming));
      } else {
        GPT_CUDA_CHECK(cudaStreamWaitEvent(stream_, last, 0));  // after the device's previous collective
      }
      {
        // A launch may wait for the peers (NCCL sets up connections on first use): watched as a running collective.
        const CommStream::HostCall call = tasks_->host_call(kNcclCall[static_cast<size_t>(op)]);
        enqueue();
      }
      GPT_CUDA_CHECK(cudaEventRecord(last, stream_));
    }
    GPT_CUDA_CHECK(cudaEventRecord(events->done, stream_));
    const int64_t bytes = n * static_cast<int64_t>(dtype_size(dtype));
    cudaStream_t compute = compute_;
    return tasks_->submit(
        op, elements, bytes,
        [this, events] {
          GPT_CUDA_CHECK(cudaSetDevice(device_));
          wait_for(events->done);
        },
        [compute, events] { GPT_CUDA_CHECK(cudaStreamWaitEvent(compute, events->done, 0)); });
  }

  // Waits for `done` (the end of one collective on the comm stream) while polling NCCL's asynchronous error:
  // a peer that died or a network failure surfaces here as an abort naming the communicator instead of a
  // silent hang (a collective that merely never completes is the watchdog's to report, which watches this
  // communicator's CommStream too). The error is read once more after `done`: NCCL documents that after an
  // error nothing can be assumed about the completion or correctness of operations. The process ends there without
  // ncclCommAbort: NCCL asks every rank of a node to call it, so on a rank whose peers are gone (or still computing)
  // it can wait for them, the hang this check is for; ending the process frees the communicator's resources.
  void wait_for(cudaEvent_t done) {
    for (int polls = 0;; ++polls) {
      const cudaError_t q = cudaEventQuery(done);
      if (q != cudaSuccess && q != cudaErrorNotReady) GPT_CUDA_CHECK(q);
      ncclResult_t async = ncclSuccess;
      GPT_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) {
        GPT_CHECK_MSG(false, ("NCCL communicator '" + name_ + "' (rank " + std::to_string(rank_) + " of " +
                              std::to_string(size_) + "): " + ncclGetErrorString(async))
                                 .c_str());
      }
      if (q == cudaSuccess) return;
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));  // spin briefly, then nap
    }
  }

  Communicator& bootstrap_;
  std::unique_ptr<Communicator> owned_bootstrap_;  // split(): the sub-group this communicator was made on
  int device_;
  cudaStream_t compute_;
  ncclComm_t comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  float* barrier_buf_ = nullptr;
  std::unique_ptr<CommStream> tasks_;
  CommWatchdog* watchdog_ = nullptr;
  std::shared_ptr<EventPool> pool_ = std::make_shared<EventPool>();
};

// The GPU as "<boot id> <PCI bus id> <host>", to find ranks sharing one (which NCCL reports only as "invalid
// usage"); "" when the bus id is not known. The kernel's boot id tells machines apart where containers on different
// nodes share a host name (NCCL's own host hash takes it too); the host name, last, is for the message (a long one
// may be cut off).
std::string gpu_identity(int device) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char bus[64] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
    cudaGetLastError();
    return "";
  }
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return (boot.empty() ? std::string() : boot + " ") + bus + " " + host;
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return 0;
  }
  return n;
}

Expected<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, int device,
                                                               void* compute_stream, std::string name) {
  // Every rank takes part in the same two bootstrap collectives whatever fails locally, so that a bad device
  // or a failed ncclGetUniqueId on one rank is an error on all of them, not a hang in ncclCommInitRank.
  Status local;
  const int devices = cuda_device_count();
  if (device < 0 || device >= devices) {
    local = Status::failed_precondition("rank " + std::to_string(bootstrap.rank()) + " needs CUDA device " +
                                        std::to_string(device) + " but this node has " + std::to_string(devices) +
                                        " visible; run one rank per GPU");
  } else if (cudaSetDevice(device) != cudaSuccess) {
    local = Status::failed_precondition("cudaSetDevice(" + std::to_string(device) + ") failed");
  }
  static_assert(sizeof(ncclUniqueId) % sizeof(int32_t) == 0);
  constexpr int64_t kIdWords = sizeof(ncclUniqueId) / sizeof(int32_t);
  std::vector<int32_t> id_msg(kIdWords, 0);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (bootstrap.rank() == 0 && local.is_ok()) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) local = Status::failed_precondition(std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
    std::memcpy(id_msg.data(), &id, sizeof(id));
  }
  bootstrap.broadcast(id_msg.data(), kIdWords, DType::kI32, 0).wait();
  std::memcpy(&id, id_msg.data(), sizeof(id));
  // Per rank: whether it is ready, and its GPU (gpu_identity, NUL-padded), so that every rank sees the same
  // verdict and none waits in ncclCommInitRank for one that gave up.
  constexpr int64_t kWords = 64;
  std::vector<int32_t> mine(kWords, 0);
  mine[0] = local.is_ok() ? 1 : 0;
  const std::string gpu = local.is_ok() ? gpu_identity(device) : "";
  std::memcpy(mine.data() + 1, gpu.data(), std::min(gpu.size(), static_cast<size_t>((kWords - 1) * 4 - 1)));
  std::vector<int32_t> all(static_cast<size_t>(bootstrap.size() * kWords), 0);
  bootstrap.all_gather(mine.data(), all.data(), kWords, DType::kI32).wait();
  if (!local.is_ok()) return local;
  std::vector<std::string> gpus;
  for (int r = 0; r < bootstrap.size(); ++r) {
    const int32_t* m = all.data() + static_cast<size_t>(r) * kWords;
    if (m[0] == 0) {
      return Status::failed_precondition("NCCL set-up failed on rank " + std::to_string(r) + " (its log has why)");
    }
    gpus.emplace_back(reinterpret_cast<const char*>(m + 1));
  }
  for (size_t a = 0; a < gpus.size(); ++a) {
    for (size_t b = a + 1; b < gpus.size(); ++b) {
      if (gpus[a].empty() || gpus[a] != gpus[b]) continue;
      return Status::failed_precondition(
          "ranks " + std::to_string(a) + " and " + std::to_string(b) + " of '" + name + "' would share one GPU (" +
          gpus[a] + "); NCCL needs one rank per GPU: check CUDA_VISIBLE_DEVICES and the tasks per node");
    }
  }
  // The communicator's comm stream exists, watched, before ncclCommInitRank, which waits for every rank to join
  // (and for NCCL's bootstrap network: a wrong NCCL_SOCKET_IFNAME would hang it): the watchdog reports it.
  auto tasks = std::make_unique<CommStream>("nccl:" + name, bootstrap.rank());
  CommWatchdog* watchdog = bootstrap.watchdog();
  if (watchdog != nullptr) watchdog->watch(tasks.get());
  ncclComm_t comm = nullptr;
  ncclResult_t r;
  {
    const CommStream::HostCall call = tasks->host_call("ncclCommInitRank");
    r = ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank());
  }
  if (r != ncclSuccess) {
    if (watchdog != nullptr) watchdog->unwatch(tasks.get());
    return Status::failed_precondition("ncclCommInitRank (rank " + std::to_string(bootstrap.rank()) + " of " +
                                       std::to_string(bootstrap.size()) + ", device " + std::to_string(device) +
                                       "): " + ncclGetErrorString(r));
  }
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(
      bootstrap, nullptr, device, static_cast<cudaStream_t>(compute_stream), comm, std::move(name), std::move(tasks)));
}

}  // namespace gpt
