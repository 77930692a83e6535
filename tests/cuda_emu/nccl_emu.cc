// The NCCL shim (shim/nccl.h) over gpt's MPI Communicator: a communicator is a split of the emulator's world
// by the ncclUniqueId its ranks share, and each collective is that MPI group's collective, run (and waited
// for) when its stream gets to it, as the runtime shim runs a created stream's work: so a collective whose
// stream does not wait for the kernels that write its buffers reads them unwritten. The arguments are checked
// as the real NCCL needs them, each violation printed and returned as ncclInvalidArgument (which
// NcclCommunicator turns into an abort naming the call): buffers must be device memory (whole ranges of
// cudaMalloc allocations), send and receive may overlap only in NCCL's in-place forms, the root must be a
// rank, the communicator must be live (not destroyed or aborted). And, as NCCL's user guide requires of several
// communicators on one device ("Using multiple NCCL communicators concurrently"), collectives run in one total
// order the ranks share: each must be launched on a stream already ordered (by stream dependencies) after the
// collective this process launched before it, on any communicator; one that is not is refused, where on GPUs the
// two could deadlock.
//
// Limitation: ncclCommInitRank splits the whole world, so every rank of the job must initialise a
// communicator at the same time (each its own). gpt-train does: the world; its splits are ncclCommSplit, a split
// of the parent's MPI group.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/dtype.h"
#include "cuda_runtime.h"
#include "nccl.h"

struct ncclComm {
  std::unique_ptr<gpt::Communicator> group;
  int rank = 0, size = 0;
};

namespace {

gpt::Communicator* g_world = nullptr;
std::mutex g_mu;
std::set<ncclComm_t> g_live;  // made by ncclCommInitRank, not yet destroyed or aborted
std::atomic<long long> g_collectives{0};
int g_ids = 0;                       // unique ids made by this rank
std::atomic<int64_t> g_launched{0};  // collectives launched by this process
constexpr char kMagic[8] = "EMUNCCL";

ncclResult_t invalid(const char* call, const std::string& why) {
  std::fprintf(stderr, "NCCL emulator: %s: %s\n", call, why.c_str());
  return ncclInvalidArgument;
}

// Queues a collective's work on its stream, which must already be ordered after the collective this process
// launched before it, on whichever communicator (a collective launched on a stream that is not, is refused).
template <class F>
ncclResult_t enqueue_collective(const char* call, cudaStream_t stream, F work) {
  const int64_t seq = g_launched++;
  const int64_t after = emu_order_collective(stream, seq);
  if (seq > 0 && after != seq - 1) {
    return invalid(call, "its stream is not ordered after collective " + std::to_string(seq - 1) +
                             " (the one launched before it, on another communicator of this device): NCCL needs one "
                             "order, by stream dependencies, for all of a device's collectives, or may deadlock");
  }
  emu_enqueue(stream, work);
  return ncclSuccess;
}

bool is_live(ncclComm_t comm) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_live.count(comm) == 1;
}

bool dtype_of(ncclDataType_t t, gpt::DType* out) {
  switch (t) {
    case ncclFloat32:
      *out = gpt::DType::kF32;
      return true;
    case ncclBfloat16:
      *out = gpt::DType::kBF16;
      return true;
    case ncclInt32:
      *out = gpt::DType::kI32;
      return true;
    default:
      return false;
  }
}

// The checks every collective makes; on success *dtype and *elem are the element type and its size.
ncclResult_t check_common(const char* call, ncclComm_t comm, ncclDataType_t type, ncclRedOp_t op, bool reduces,
                          gpt::DType* dtype, size_t* elem) {
  if (!is_live(comm)) return invalid(call, "not a live communicator");
  if (!dtype_of(type, dtype)) return invalid(call, "a data type gpt-train does not use: " + std::to_string(type));
  if (reduces && op != ncclSum) return invalid(call, "only ncclSum is emulated");
  *elem = gpt::dtype_size(*dtype);
  ++g_collectives;
  return ncclSuccess;
}

ncclResult_t check_device(const char* call, const char* what, const void* p, size_t bytes) {
  if (bytes > 0 && !emu_is_device(p, bytes)) {
    return invalid(call, std::string(what) + " is not " + std::to_string(bytes) + " bytes of device memory");
  }
  return ncclSuccess;
}

bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + bn && y < x + an;
}

}  // namespace

void nccl_emu_set_world(gpt::Communicator* world) { g_world = world; }
long long nccl_emu_collectives() { return g_collectives.load(); }

int nccl_emu_live_comms() {
  std::lock_guard<std::mutex> lock(g_mu);
  return static_cast<int>(g_live.size());
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (NCCL emulator; its message is on stderr)";
    case ncclInvalidUsage:
      return "invalid usage (NCCL emulator)";
    default:
      return "NCCL emulator error";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (g_world == nullptr) return invalid("ncclGetUniqueId", "nccl_emu_set_world was not called");
  std::memset(id, 0, sizeof(*id));
  std::memcpy(id->internal, kMagic, sizeof(kMagic));
  const int32_t words[2] = {g_world->rank(), g_ids++};
  std::memcpy(id->internal + sizeof(kMagic), words, sizeof(words));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  const char* call = "ncclCommInitRank";
  if (g_world == nullptr) return invalid(call, "nccl_emu_set_world was not called");
  if (std::memcmp(id.internal, kMagic, sizeof(kMagic)) != 0) return invalid(call, "not an id from ncclGetUniqueId");
  int32_t words[2];
  std::memcpy(words, id.internal + sizeof(kMagic), sizeof(words));
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return invalid(call, "rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  }
  // The ranks holding the same id (its maker's world rank and count) form the group, ordered by `rank`.
  const int color = words[0] * 4096 + words[1] % 4096;
  auto made = std::make_unique<ncclComm>();
  made->group = g_world->split(color, rank, "nccl-emu." + std::to_string(color));
  made->rank = made->group->rank();
  made->size = made->group->size();
  if (made->size != nranks || made->rank != rank) {
    return invalid(call, "the ranks sharing this id are " + std::to_string(made->size) + ", this one is " +
                             std::to_string(made->rank) + "; the caller said " + std::to_string(rank) + " of " +
                             std::to_string(nranks));
  }
  *comm = made.release();
  std::lock_guard<std::mutex> lock(g_mu);
  g_live.insert(*comm);
  return ncclSuccess;
}

// The parent's ranks split by color, ordered by key (every rank of the parent calls it; no NCCL_SPLIT_NOCOLOR).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  const char* call = "ncclCommSplit";
  if (!is_live(comm)) return invalid(call, "not a live communicator");
  if (config != nullptr) return invalid(call, "only a null config (the parent's) is emulated");
  if (color < 0) return invalid(call, "a negative color (NCCL_SPLIT_NOCOLOR) is not emulated");
  auto made = std::make_unique<ncclComm>();
  made->group = comm->group->split(color, key, "nccl-emu-split." + std::to_string(color));
  made->rank = made->group->rank();
  made->size = made->group->size();
  *newcomm = made.release();
  std::lock_guard<std::mutex> lock(g_mu);
  g_live.insert(*newcomm);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_live.erase(comm) != 1) return invalid("ncclCommDestroy", "not a live communicator");
  }
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!is_live(comm)) return invalid("ncclCommUserRank", "not a live communicator");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!is_live(comm)) return invalid("ncclCommCount", "not a live communicator");
  *count = comm->size;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (!is_live(comm)) return invalid("ncclCommGetAsyncError", "not a live communicator");
  *async_error = ncclSuccess;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  const char* call = "ncclAllReduce";
  gpt::DType dtype;
  size_t elem = 0;
  if (auto r = check_common(call, comm, type, op, true, &dtype, &elem); r != ncclSuccess) return r;
  const size_t bytes = count * elem;
  if (auto r = check_device(call, "sendbuff", send, bytes); r != ncclSuccess) return r;
  if (auto r = check_device(call, "recvbuff", recv, bytes); r != ncclSuccess) return r;
  if (send != recv && overlap(send, bytes, recv, bytes)) return invalid(call, "send and recv overlap, not in place");
  gpt::Communicator* group = comm->group.get();
  return enqueue_collective(call, stream, [=] {
    if (send != recv) std::memcpy(recv, send, bytes);
    group->all_reduce(recv, static_cast<int64_t>(count), dtype).wait();
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  const char* call = "ncclReduceScatter";
  gpt::DType dtype;
  size_t elem = 0;
  if (auto r = check_common(call, comm, type, op, true, &dtype, &elem); r != ncclSuccess) return r;
  const size_t block = recv_count * elem, all = block * static_cast<size_t>(comm->size);
  if (auto r = check_device(call, "sendbuff", send, all); r != ncclSuccess) return r;
  if (auto r = check_device(call, "recvbuff", recv, block); r != ncclSuccess) return r;
  // In place (NCCL's definition): recvbuff is this rank's block of sendbuff.
  const bool in_place = static_cast<const char*>(send) + block * static_cast<size_t>(comm->rank) == recv;
  if (!in_place && overlap(send, all, recv, block)) return invalid(call, "recvbuff overlaps sendbuff, not in place");
  gpt::Communicator* group = comm->group.get();
  return enqueue_collective(call, stream, [=] {
    const std::vector<char> copy(static_cast<const char*>(send), static_cast<const char*>(send) + all);
    group->reduce_scatter(copy.data(), recv, static_cast<int64_t>(recv_count), dtype).wait();
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* call = "ncclAllGather";
  gpt::DType dtype;
  size_t elem = 0;
  if (auto r = check_common(call, comm, type, ncclSum, false, &dtype, &elem); r != ncclSuccess) return r;
  const size_t block = send_count * elem, all = block * static_cast<size_t>(comm->size);
  if (auto r = check_device(call, "sendbuff", send, block); r != ncclSuccess) return r;
  if (auto r = check_device(call, "recvbuff", recv, all); r != ncclSuccess) return r;
  // In place (NCCL's definition): sendbuff is this rank's block of recvbuff.
  const bool in_place = static_cast<const char*>(recv) + block * static_cast<size_t>(comm->rank) == send;
  if (!in_place && overlap(send, block, recv, all)) return invalid(call, "sendbuff overlaps recvbuff, not in place");
  gpt::Communicator* group = comm->group.get();
  return enqueue_collective(call, stream, [=] {
    const std::vector<char> copy(static_cast<const char*>(send), static_cast<const char*>(send) + block);
    group->all_gather(copy.data(), recv, static_cast<int64_t>(send_count), dtype).wait();
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  const char* call = "ncclBroadcast";
  gpt::DType dtype;
  size_t elem = 0;
  if (auto r = check_common(call, comm, type, ncclSum, false, &dtype, &elem); r != ncclSuccess) return r;
  if (root < 0 || root >= comm->size) return invalid(call, "root " + std::to_string(root) + " is not a rank");
  const size_t bytes = count * elem;
  if (comm->rank == root) {
    if (auto r = check_device(call, "sendbuff", send, bytes); r != ncclSuccess) return r;
  }
  if (auto r = check_device(call, "recvbuff", recv, bytes); r != ncclSuccess) return r;
  const bool copy = comm->rank == root && send != recv;
  if (copy && overlap(send, bytes, recv, bytes)) return invalid(call, "send and recv overlap, not in place");
  gpt::Communicator* group = comm->group.get();
  return enqueue_collective(call, stream, [=] {
    if (copy) std::memcpy(recv, send, bytes);
    group->broadcast(recv, static_cast<int64_t>(count), dtype, root).wait();
  });
}
