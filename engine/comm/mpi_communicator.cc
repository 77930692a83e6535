#include "comm/mpi_communicator.h"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "comm/comm_stream.h"
#include "core/check.h"

#define GPT_MPI_CHECK(call) GPT_CHECK_MSG((call) == MPI_SUCCESS, #call)

namespace gpt {

namespace {

// bf16 travels as a 2-byte type with a user-defined sum computed through fp32.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const bf16*>(in);
  auto* b = static_cast<bf16*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

struct MpiTypes {
  MPI_Datatype bf16_type = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum_op = MPI_OP_NULL;
};

MpiTypes& mpi_types() {
  static MpiTypes types;
  return types;
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kBF16:
      return mpi_types().bf16_type;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kU16:
      return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_sum(DType t) { return t == DType::kBF16 ? mpi_types().bf16_sum_op : MPI_SUM; }

// Every MPI call that enters Open MPI's progress engine (starting a non-blocking operation, MPI_Test, the
// watchdog's MPI_Iprobe/MPI_Recv/MPI_Isend) is made under this lock, never held while sleeping. Without it,
// three kinds of threads (each communicator's CommStream, the watchdog polling every 200 ms) drive progress
// at once, so e.g. the watchdog's MPI_Iprobe runs the matching and unpacking of the world communicator's
// collectives into trainer buffers (seen under ThreadSanitizer); that leans on Open MPI 4.1's
// MPI_THREAD_MULTIPLE paths (ob1 matching, coll/libnbc), the suspect of a rare heap corruption.
std::mutex& mpi_mutex() {
  static std::mutex mu;
  return mu;
}

// Completes a non-blocking collective without monopolising a core: MPI's blocking calls busy-poll, and
// under mpirun's one-core-per-rank binding that spinning comm thread starves the compute threads of its
// own rank. So: test, and between tests sleep briefly (after a short spin for small, fast collectives).
void complete(MPI_Request* request) {
  for (int spins = 0;; ++spins) {
    int done = 0;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      GPT_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    }
    if (done) return;
    if (spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

int count(int64_t n) {
  GPT_CHECK_MSG(n >= 0 && n <= INT_MAX, "collective larger than INT_MAX elements");
  return static_cast<int>(n);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned, std::string name, CommWatchdog* watchdog)
      : comm_(comm), owned_(owned), name_(std::move(name)), watchdog_(watchdog) {
    GPT_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    GPT_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    stream_ = std::make_unique<CommStream>(name_, rank_);
    // A "checkpoint" group waits on file systems (a rank that writes nothing waits for the others' writes): the
    // watchdog holds it to comm.save_timeout_s instead.
    if (watchdog_ != nullptr) watchdog_->watch(stream_.get(), /*slow=*/name_ == "checkpoint");
  }
  ~MpiCommunicator() override {
    if (watchdog_ != nullptr) watchdog_->unwatch(stream_.get());
    stream_.reset();  // finish queued collectives before freeing the communicator
    if (owned_) {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      MPI_Comm_free(&comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view group_name() const override { return name_; }

  Work all_reduce(void* buf, int64_t n, DType dtype) override {
    return stream_->submit(CommOp::kAllReduce, n, bytes(n, dtype), [=, this] {
      MPI_Request req;
      {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        GPT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, count(n), mpi_type(dtype), mpi_sum(dtype), comm_, &req));
      }
      complete(&req);
    });
  }
  Work reduce_scatter(const void* send, void* recv, int64_t n, DType dtype) override {
    return stream_->submit(CommOp::kReduceScatter, n * size_, bytes(n * size_, dtype), [=, this] {
      MPI_Request req;
      {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        GPT_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, count(n), mpi_type(dtype), mpi_sum(dtype), comm_, &req));
      }
      complete(&req);
    });
  }
  Work all_gather(const void* send, void* recv, int64_t n, DType dtype) override {
    const bool in_place = send == static_cast<const char*>(recv) + n * rank_ * dtype_size(dtype);
    return stream_->submit(CommOp::kAllGather, n * size_, bytes(n * size_, dtype), [=, this] {
      MPI_Request req;
      {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        GPT_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, count(n), mpi_type(dtype), recv, count(n),
                                     mpi_type(dtype), comm_, &req));
      }
      complete(&req);
    });
  }
  Work broadcast(void* buf, int64_t n, DType dtype, int root) override {
    return stream_->submit(CommOp::kBroadcast, n, bytes(n, dtype), [=, this] {
      MPI_Request req;
      {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        GPT_MPI_CHECK(MPI_Ibcast(buf, count(n), mpi_type(dtype), root, comm_, &req));
      }
      complete(&req);
    });
  }
  Work barrier() override {
    return stream_->submit(CommOp::kBarrier, 0, 0, [this] {
      MPI_Request req;
      {
        std::lock_guard<std::mutex> lock(mpi_mutex());
        GPT_MPI_CHECK(MPI_Ibarrier(comm_, &req));
      }
      complete(&req);
    });
  }
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
    MPI_Comm sub = MPI_COMM_NULL;
    // Blocking, and under the lock: splits come one at a time from the main thread, in the same order on every
    // rank, and the split's own progress completes other communicators' collectives, so holding it cannot
    // deadlock; the other threads' short MPI calls wait for it.
    stream_->run_sync([&] {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      GPT_MPI_CHECK(MPI_Comm_split(comm_, color, key, &sub));
    });
    return std::make_unique<MpiCommunicator>(sub, true, std::move(name), watchdog_);
  }
  CommStats stats() const override { return stream_->stats(); }
  CommWatchdog* watchdog() const override { return watchdog_; }

 private:
  static int64_t bytes(int64_t n, DType t) { return n * static_cast<int64_t>(dtype_size(t)); }
  MPI_Comm comm_;
  bool owned_;
  std::string name_;
  CommWatchdog* watchdog_;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<CommStream> stream_;
};

// A CollectiveRecord as fixed-size bytes for the watchdog's all-gather.
struct WireRecord {
  char group[24];
  uint64_t seq;
  int64_t elements;
  int32_t op, done;
};
constexpr size_t kWireRecords = 8 * CommStream::kHistory;  // up to 8 streams per rank (hybrid on GPUs has 6)

// Sends this rank's history to every other rank and receives theirs over `comm` (a duplicate of the world kept for
// this), point to point, so that a rank that does not answer within `timeout_s` is known by name (nullopt). Its
// buffers are never freed: the sends are not waited for (a peer may be gone) and a late peer's message may still land
// in them; the exchange happens once, just before the job is aborted.
constexpr int kHistoryTag = 8;
std::vector<std::optional<std::vector<CollectiveRecord>>> exchange_histories(
    MPI_Comm comm, double timeout_s, const std::vector<CollectiveRecord>& mine) {
  int size = 1, rank = 0;
  MPI_Comm_size(comm, &size);
  MPI_Comm_rank(comm, &rank);
  std::vector<std::optional<std::vector<CollectiveRecord>>> all(static_cast<size_t>(size));
  auto* buffers = new std::vector<WireRecord>(kWireRecords * static_cast<size_t>(size + 1));
  std::vector<WireRecord>& recv = *buffers;  // rank r's at r * kWireRecords; this rank's own to send at the end
  WireRecord* send = recv.data() + static_cast<size_t>(size) * kWireRecords;
  for (size_t i = 0; i < kWireRecords; ++i) send[i] = WireRecord{};
  const size_t n = std::min(mine.size(), kWireRecords);
  for (size_t i = 0; i < n; ++i) {
    const CollectiveRecord& r = mine[mine.size() - n + i];
    std::snprintf(send[i].group, sizeof(send[i].group), "%s", r.group.c_str());
    send[i].seq = r.seq;
    send[i].elements = r.elements;
    send[i].op = static_cast<int32_t>(r.op);
    send[i].done = r.done ? 1 : 0;
  }
  const int bytes = static_cast<int>(sizeof(WireRecord) * kWireRecords);
  std::copy(send, send + kWireRecords, recv.data() + static_cast<size_t>(rank) * kWireRecords);
  std::vector<MPI_Request> recvs(static_cast<size_t>(size), MPI_REQUEST_NULL);
  std::vector<bool> answered(static_cast<size_t>(size), false);
  answered[static_cast<size_t>(rank)] = true;
  {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      MPI_Request req;  // never waited for: a peer that is gone would hold it forever
      MPI_Isend(send, bytes, MPI_BYTE, r, kHistoryTag, comm, &req);
      MPI_Request_free(&req);
      MPI_Irecv(recv.data() + static_cast<size_t>(r) * kWireRecords, bytes, MPI_BYTE, r, kHistoryTag, comm,
                &recvs[static_cast<size_t>(r)]);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int left = size - 1; left > 0;) {
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      for (int r = 0; r < size; ++r) {
        int done = 0;
        if (answered[static_cast<size_t>(r)]) continue;
        MPI_Test(&recvs[static_cast<size_t>(r)], &done, MPI_STATUS_IGNORE);
        if (done) {
          answered[static_cast<size_t>(r)] = true;
          --left;
        }
      }
    }
    if (left == 0 || std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < size; ++r) {
    if (!answered[static_cast<size_t>(r)]) continue;
    auto& history = all[static_cast<size_t>(r)].emplace();
    for (size_t i = 0; i < kWireRecords; ++i) {
      const WireRecord& w = recv[static_cast<size_t>(r) * kWireRecords + i];
      if (w.seq == 0) continue;
      history.push_back({std::string(w.group, strnlen(w.group, sizeof(w.group))), w.seq, static_cast<CommOp>(w.op),
                         w.elements, w.done != 0});
    }
  }
  return all;
}

}  // namespace

Expected<std::unique_ptr<MpiEnvironment>> MpiEnvironment::init(int* argc, char*** argv) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
    return Status::failed_precondition("MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    MPI_Finalize();
    return Status::failed_precondition("this MPI library does not provide MPI_THREAD_MULTIPLE");
  }
  std::unique_ptr<MpiEnvironment> env(new MpiEnvironment());
  GPT_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &env->world_rank_));
  GPT_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &env->world_size_));
  MPI_Comm node = MPI_COMM_NULL;
  GPT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->world_rank_, MPI_INFO_NULL, &node));
  GPT_MPI_CHECK(MPI_Comm_rank(node, &env->local_rank_));
  GPT_MPI_CHECK(MPI_Comm_size(node, &env->local_size_));
  MPI_Comm_free(&node);
  MpiTypes& t = mpi_types();
  GPT_MPI_CHECK(MPI_Type_contiguous(1, MPI_UINT16_T, &t.bf16_type));
  GPT_MPI_CHECK(MPI_Type_commit(&t.bf16_type));
  GPT_MPI_CHECK(MPI_Op_create(&bf16_sum, /*commute=*/1, &t.bf16_sum_op));
  return env;
}

MpiEnvironment::~MpiEnvironment() {
  watchdog_.reset();  // its thread may use MPI
  MpiTypes& t = mpi_types();
  if (t.bf16_sum_op != MPI_OP_NULL) MPI_Op_free(&t.bf16_sum_op);
  if (t.bf16_type != MPI_DATATYPE_NULL) MPI_Type_free(&t.bf16_type);
  MPI_Finalize();
}

std::unique_ptr<Communicator> MpiEnvironment::make_world() {
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false, "world", watchdog_.get());
}

void MpiEnvironment::start_watchdog(double timeout_s, double save_timeout_s) {
  MPI_Comm channel = MPI_COMM_NULL;
  {
    // Collective, so every rank makes it whatever its comm.timeout_s (ranks whose configs differ must reach the
    // comparison that says so, not hang here). Never freed: it lives as long as the watchdog.
    std::lock_guard<std::mutex> lock(mpi_mutex());
    GPT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &channel));
  }
  if (timeout_s <= 0) return;
  constexpr int kAlertTag = 7;
  WatchdogChannel wire;
  wire.exchange = [channel, timeout_s](const std::vector<CollectiveRecord>& mine) {
    return exchange_histories(channel, timeout_s, mine);
  };
  wire.alert_all = [channel, rank = world_rank_, size = world_size_] {
    static int32_t alert = 1;  // the sends are never waited for: the job ends right after
    std::lock_guard<std::mutex> lock(mpi_mutex());
    for (int r = 0; r < size; ++r) {
      MPI_Request req;
      if (r != rank) MPI_Isend(&alert, 1, MPI_INT32_T, r, kAlertTag, channel, &req);
    }
  };
  wire.alerted = [channel] {
    int flag = 0;
    MPI_Status status;
    std::lock_guard<std::mutex> lock(mpi_mutex());  // the MPI_Recv below completes at once (the probe matched)
    MPI_Iprobe(MPI_ANY_SOURCE, kAlertTag, channel, &flag, &status);
    if (flag == 0) return false;
    int32_t alert = 0;
    MPI_Recv(&alert, 1, MPI_INT32_T, status.MPI_SOURCE, kAlertTag, channel, MPI_STATUS_IGNORE);
    return true;
  };
  watchdog_->start(timeout_s, save_timeout_s, world_rank_, std::move(wire), [](const std::string& diagnosis) {
    spdlog::error("{}", diagnosis);
    spdlog::default_logger()->flush();
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 3);
    std::abort();
  });
}

void MpiEnvironment::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();
}

}  // namespace gpt
