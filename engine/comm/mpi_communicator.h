// The MPI side of communication: MpiEnvironment owns MPI's lifetime (MPI_Init_thread with
// MPI_THREAD_MULTIPLE, since every communicator runs its collectives on its own comm-stream thread) and
// knows the process's place (world rank and size, local rank and size on its node from
// MPI_Comm_split_type SHARED, which works under both mpirun and srun, neither of which we read variables
// of). make_world() returns the MPI Communicator over MPI_COMM_WORLD; split() makes sub-groups.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "comm/watchdog.h"
#include "core/status.h"

namespace gpt {

class MpiEnvironment {
 public:
  // Initialises MPI once per process. Errors if MPI cannot give MPI_THREAD_MULTIPLE.
  static Expected<std::unique_ptr<MpiEnvironment>> init(int* argc, char*** argv);
  ~MpiEnvironment();  // MPI_Finalize
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  std::unique_ptr<Communicator> make_world();
  // The collective watchdog over every communicator made here (and their splits): after timeout_s seconds
  // in one collective, every rank logs its recent collectives, the ranks compare them, and the job ends
  // (MPI_Abort) with the first collective where they disagree. 0 = off. Collective over MPI_COMM_WORLD.
  // Communicators named "checkpoint" get save_timeout_s instead (0 = not watched): their collectives legitimately
  // wait for file writes. A rank that does not answer the comparison within timeout_s is named.
  void start_watchdog(double timeout_s, double save_timeout_s);
  // Ends every rank of the job (after a failure on this one has been logged).
  [[noreturn]] void abort(int exit_code);

 private:
  MpiEnvironment() = default;
  int world_rank_ = 0, world_size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::unique_ptr<CommWatchdog> watchdog_ = std::make_unique<CommWatchdog>();
};

}  // namespace gpt
