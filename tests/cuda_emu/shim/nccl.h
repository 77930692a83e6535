// The NCCL API that engine/comm/nccl_communicator.cc uses, emulated over MPI for the CPU (nccl_emu.cc,
// README.md): each rank is a process with one emulated GPU; a communicator is an MPI sub-communicator of the
// ranks that share its ncclUniqueId. A collective checks what the real NCCL requires of its arguments at the
// call (device buffers, cudaMalloc'd and whole; a live communicator; in-place forms exactly as NCCL defines
// them) and runs when its stream gets to it, like every emulated launch on a created stream.
#pragma once
#include <cstddef>

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclFloat32 = 7, ncclBfloat16 = 9 };
enum ncclRedOp_t { ncclSum = 0 };
struct ncclUniqueId {
  char internal[128];
};
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;

const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
// Only a null config (the parent's) is emulated.
struct ncclConfig_t {
  int emulated;
};
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recv_count, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream);

// The emulator's own set-up (nccl_emu.cc): the MPI world communicator whose splits become NCCL communicators.
// Must be called before ncclCommInitRank and outlive every communicator.
namespace gpt {
class Communicator;
}
void nccl_emu_set_world(gpt::Communicator* world);
// How many NCCL communicators are alive on this rank (tests check that destruction frees them).
int nccl_emu_live_comms();
// How many collectives this rank has issued (all_reduce, reduce_scatter, all_gather, broadcast).
long long nccl_emu_collectives();
