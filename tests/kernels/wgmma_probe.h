// The wgmma probe: wgmma_ptx.cuh's wrappers (wgmma m64n64k16 and m64n32k16 with A and B from 128-byte-swizzled
// shared tiles, K-major or both MN-major, and m64n64k16 with A from registers and an MN-major B) run on one warpgroup
// over known inputs, the tiles stored by sw128_offset, the A registers built and the accumulators read back by the PTX
// ISA's tables (wgmma_ptx.cuh), written out here apart from any kernel. On an sm_90 GPU it says whether the
// descriptors, the swizzle and the layouts the wgmma kernels assume are the hardware's; in the emulator it checks the
// emulation against the same tables.
#pragma once

#include <cstdint>
#include <vector>

namespace gpt::cuda {

struct WgmmaProbeIn {
  std::vector<uint16_t> a;   // 64 x 64 bf16 bits, row-major (m, k)
  std::vector<uint16_t> kt;  // 64 x 64, row-major (n, k): B = kt^T, K-major
  std::vector<uint16_t> v;   // 64 x 64, row-major (k, n): B = v, MN-major
  std::vector<uint16_t> at;  // 64 x 64, row-major (k, m): A = at^T, MN-major
};

struct WgmmaProbeOut {
  std::vector<float> d_ss;  // 64 x 64 row-major: A kt^T, A and kt from shared memory (4 k-steps)
  std::vector<float> d_rs;  // 64 x 64 row-major: A v, A from registers, v from shared memory (4 k-steps)
  std::vector<float> d_32;  // 64 x 32 row-major: A kt[0, 32)^T, m64n32k16 from shared memory
  std::vector<float> d_tt;  // 64 x 64 row-major: at^T v, both MN-major in shared memory (both transpose flags)
};

// Whether the current device is sm_90 (Hopper), where the probe's instructions exist.
bool wgmma_probe_supported();
// Runs the probe on the current device (one block of 128 threads); a CUDA error aborts, naming the call.
WgmmaProbeOut run_wgmma_probe(const WgmmaProbeIn& in);

}  // namespace gpt::cuda
