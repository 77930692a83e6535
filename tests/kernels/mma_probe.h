// The PTX probe: mma_ptx.cuh's wrappers (mma.sync m16n8k16, ldmatrix, cvt.rn.bf16x2.f32, cp.async) and common.cuh's
// bf16x2_nearest (the kernels' bf16 stores) run on one warp
// over small known inputs, their fragments built and read back by the PTX ISA's own tables ("Matrix fragments for
// mma.m16n8k16", "ldmatrix"), written out here independently of the attention kernels. On a GPU it says whether the
// wrappers' inline PTX and the layouts the kernels assume are the hardware's, apart from any kernel's logic (the
// attention parity tests cover the kernels); in the emulator (tests/cuda_emu, converted) it checks the emulation
// of the same instructions against the same tables.
#pragma once

#include <cstdint>
#include <vector>

namespace gpt::cuda {

struct MmaProbeIn {
  std::vector<uint16_t> a;      // 16 x 16 bf16 bits, row-major: the A operand (rows m, columns k)
  std::vector<uint16_t> b;      // 16 x 16, row-major (rows k, columns n): B for two n-tiles of 8 columns
  std::vector<uint16_t> kt;     // 16 x 16, row-major (rows n, columns k): B = kt^T for two n-tiles
  std::vector<float> c;         // 16 x 8, row-major: the accumulators' initial values
  std::vector<uint16_t> codes;  // 16 x 16 b16 values, row-major, for ldmatrix as moved bits
  std::vector<float> lo, hi;    // 32 each: pack_bf16x2(lo[lane], hi[lane]) and bf16x2_nearest(lo[lane], hi[lane])
  std::vector<uint16_t> copy;   // 256 b16 values: cp.async's source, 16 bytes (8 values) per lane
};

struct MmaProbeOut {
  // Each 2 x 16 x 8 (n-tile, row, column), D = A B + C stored by the accumulator table:
  std::vector<float> d_direct;         // fragments of A and b built element by element from the tables
  std::vector<float> d_trans;          // A by ldmatrix_x4, B by ldmatrix_x4_trans from b (as P V in attention)
  std::vector<float> d_kt;             // A by ldmatrix_x4, B by ldmatrix_x4 from kt (as Q K^T in attention)
  std::vector<uint32_t> ld, ld_trans;  // 32 lanes x 4 registers: ldmatrix_x4 (.trans) of `codes`' four 8x8 matrices
  std::vector<uint32_t> packed;        // 32: pack_bf16x2 (cvt.rn.bf16x2.f32)
  std::vector<uint32_t> nearest;       // 32: common.cuh's bf16x2_nearest (cvt, and the integer path for NaNs)
  std::vector<uint16_t> copied;        // 256: shared memory after cp.async: even lanes' 16 bytes, odd lanes' 0
};

// Runs the probe on the current device (one block of 32 threads); a CUDA error aborts, naming the call.
MmaProbeOut run_mma_probe(const MmaProbeIn& in);

}  // namespace gpt::cuda
