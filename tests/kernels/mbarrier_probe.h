// The mbarrier probe: mbarrier_ptx.cuh's wrappers (mbarrier init / arrive / parity wait, cp.async's arrival on an
// mbarrier, named barriers' bar.sync and bar.arrive) in a two-stage producer/consumer ring, alone: one producer warp
// fills the ring by cp.async and by plain stores, four consumer warps copy each stage out and release it. On an
// sm_90 GPU it says whether the warp-specialised kernels' synchronisation does what mbarrier_ptx.cuh says, apart from
// any kernel's logic (the [ws] parity cases cover the kernels); in the emulator it checks the emulation.
#pragma once

#include <vector>

namespace gpt::cuda {

constexpr int kMbarrierProbeTiles = 6;  // tiles of 128 floats through two stages: each stage refilled twice

struct MbarrierProbeOut {
  std::vector<float> copied;  // kMbarrierProbeTiles x 128: each tile as the consumers read it (by cp.async: src's)
  // kMbarrierProbeTiles x 4 warps x 32 lanes: what consumer warp w's lane read of the producer's plain stores, the
  // producer lane's (lane ^ w) value t * 1000 + (lane ^ w) of tile t
  std::vector<float> stored;
  // 8: consumer warp w's read of warp (w + 1) % 4's flag (w + 2) after bar.sync over the four (named barrier 1), then
  // of the producer's flag (77) after its bar.arrive and their bar.sync (named barrier 2, 160 threads)
  std::vector<float> named;
};

// Runs the probe on the current device (one block of 256 threads) over src (kMbarrierProbeTiles x 128 floats); a CUDA
// error aborts, naming the call. REQUIRES an sm_90 device (wgmma_probe_supported).
MbarrierProbeOut run_mbarrier_probe(const std::vector<float>& src);

}  // namespace gpt::cuda
