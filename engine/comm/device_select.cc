#include "comm/device_select.h"

#include <cstdlib>
#include <string>

namespace gpt {

Expected<int> device_for_local_rank(int local_rank, int local_size, int device_count) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string where = visible != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")" : "";
  if (device_count <= 0) {
    return Status::failed_precondition("no CUDA device is visible to this process" + where +
                                       "; run on a GPU node or use the CPU backend");
  }
  // Slurm's --gpus-per-task (or a launcher that sets CUDA_VISIBLE_DEVICES per rank) shows each rank only its
  // own GPU: device 0.
  if (device_count == 1 && visible != nullptr && local_size > 1) return 0;
  if (local_size > device_count) {
    return Status::failed_precondition(
        std::to_string(local_size) + " ranks run on this node but only " + std::to_string(device_count) +
        " GPU(s) are visible" + where + "; launch one rank per GPU (srun --ntasks-per-node=" +
        std::to_string(device_count) + ", or mpirun -np <nodes x " + std::to_string(device_count) + ">)");
  }
  if (local_rank < 0 || local_rank >= local_size) {
    return Status::invalid_argument("local rank " + std::to_string(local_rank) + " is outside [0, " +
                                    std::to_string(local_size) + ")");
  }
  return local_rank;
}

}  // namespace gpt
