// Which GPU a rank uses: one rank per GPU, chosen by the rank's index on its node (its local rank, from
// MPI_Comm_split_type SHARED, which works under mpirun and srun alike). A pure function, so the rule and its
// error are tested without GPUs.
#pragma once

#include "core/status.h"

namespace gpt {

// The device of local rank `local_rank` of `local_size` ranks on a node with `device_count` visible GPUs;
// device 0 when CUDA_VISIBLE_DEVICES shows each rank a single GPU (per-task binding).
// Errors: no GPU visible; more ranks on the node than GPUs (naming both counts and how to launch).
Expected<int> device_for_local_rank(int local_rank, int local_size, int device_count);

}  // namespace gpt
