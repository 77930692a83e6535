// The NCCL Communicator (compiled when CUDA is found): collectives between GPUs, one rank per GPU. Built from
// a bootstrap Communicator over the same ranks (MPI): rank 0's ncclUniqueId is broadcast over it, then every
// rank joins with ncclCommInitRank on its own device. Collectives run on the communicator's own CUDA stream,
// in issue order: at issue, an event recorded on the compute stream orders the collective after the kernels
// that produced its buffers. The NCCL call is launched on the issuing thread, so every communicator's
// kernels are launched in the same order on every rank; the Work completes when the GPU has finished it (a
// CommStream thread waits for an event after it, polling NCCL's async error, so Work::wait() works from the
// host as for MPI, and the compute stream keeps going meanwhile); Work::join() instead makes the compute stream
// wait for that event on the GPU, without blocking the host. All of a device's NCCL communicators (hybrid: world,
// shard and replicate groups) run their collectives in one order on the GPU, the order of launch, each waiting for
// the one before it (NCCL's user guide: collectives of several communicators on one device need one total order by
// stream dependencies, or may deadlock). Buffers are device pointers. Reductions are sums;
// bf16 is summed by NCCL in bf16 (ncclBfloat16). split() splits the bootstrap and the NCCL
// communicator alike (ncclCommSplit: no new unique id or bootstrap network).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace gpt {

// Number of CUDA devices visible to this process (0 when there is no driver or no GPU).
int cuda_device_count();

// Collective over `bootstrap` (which must outlive the result). `device`: the CUDA device of this rank (the
// local rank); `compute_stream`: the cudaStream_t whose work each collective must follow (nullptr = the
// legacy default stream). Errors: no such device, two ranks on one GPU (by host and PCI bus id, naming them), NCCL
// initialisation failure (with NCCL's message). Every rank gets the same verdict on the first two.
Expected<std::unique_ptr<Communicator>> make_nccl_communicator(Communicator& bootstrap, int device,
                                                               void* compute_stream = nullptr,
                                                               std::string name = "world");

}  // namespace gpt
