// attention_wgmma.cu's and attention_wgmma_backward.cu's shared part (their own, not an interface): the tile
// sizes, the backward's shared-memory layout, the swizzled tile copy and the switches. Read attention_wgmma.cu's
// opening comment first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/switches.h"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace gpt::cuda::attention_wgmma_detail {

using namespace attention_mma_detail;

constexpr int kD = 64, kBQ = 64, kBK = 64;
constexpr uint32_t kTile = 64 * kSw128Row;  // one 64 x 64 bf16 tile: 8 KB
// The forward's shared memory at kWG warpgroups per block and nk keys per tile: their Q tiles, two stages of K and V,
// 1 KB to align.
constexpr size_t forward_smem(int kWG, int nk) { return (kWG + 4 * (nk / 64)) * size_t{kTile} + 1024; }
// The dQ kernel's: two stages of kWG dS^T tiles and a K tile.
constexpr size_t dq_smem(int kWG) { return 2 * (kWG + 1) * size_t{kTile} + 1024; }
constexpr int kStageLd = kD + 8;  // the output's staging rows (store_rows), in the dead K/V stages

// The dK/dV kernel's shared memory at kWG warpgroups per block: K and V tiles of 64 kWG rows, then per stage a Q and
// a dO tile (BQ swizzled rows), then lse and D (BQ floats each), rounded up to keep the next stage 1024-byte aligned;
// two stages; then each warp's dS^T staging rows (16 keys x BQ queries, kDsLd bytes apart: 16 bytes of padding, so
// that the fragments' 4-byte stores fall in distinct banks).
template <int BQ>
struct BwdKvWgmmaCfg {
  static constexpr uint32_t kQTile = BQ * kSw128Row;
  static constexpr uint32_t kStageBytes = (2 * kQTile + 2 * sizeof(float) * BQ + 1023) / 1024 * 1024;
  static constexpr uint32_t kDsLd = 2 * BQ + 16;
  static constexpr uint32_t kDsWarpBytes = 16 * kDsLd;
  static constexpr size_t bytes(int kWG) {
    return 2 * kWG * size_t{kTile} + 2 * size_t{kStageBytes} + 4 * kWG * size_t{kDsWarpBytes} + 1024;
  }
};

// Rows [row0, row0 + ROWS) x 64 channels of a bf16 matrix with row stride ld into a swizzled tile, by cp.async (16
// bytes each; rows at or past `rows` zero-filled, their source not read).
// NT: the block's threads (blockDim.x), which share the copies: thread t copies column piece t % 8 of rows t / 8,
// t / 8 + NT / 8, ... (a loop of fixed count, unrolled).
template <int ROWS = 64, int NT = kThreads>
__device__ inline void copy_tile_sw128(unsigned char* dst, const bf16* src, int64_t ld, int row0, int rows) {
  static_assert(ROWS * 8 % NT == 0);
#ifdef GPT_CUDA_EMULATOR
  if (blockDim.x != NT) emu_fail("copy_tile_sw128: a block of other than NT threads");
#endif
  const int r0 = static_cast<int>(threadIdx.x) / 8, c = (static_cast<int>(threadIdx.x) % 8) * 8;
#pragma unroll
  for (int j = 0; j < ROWS * 8 / NT; ++j) {
    const int r = r0 + j * (NT / 8), row = row0 + r;
    const bool in = row < rows;
    cp_async_16(dst + sw128_offset(r, c), src + (in ? static_cast<int64_t>(row) * ld : 0) + c, in ? 16u : 0u);
  }
}

// GPT_ATTENTION_WGMMA_OVERLAP (read at each launch): 1 for both overlapped kernels, or `part` (fwd, bwd) for one.
inline bool overlap_enabled(const char* part) {
  return env_is("GPT_ATTENTION_WGMMA_OVERLAP", "1") || env_is("GPT_ATTENTION_WGMMA_OVERLAP", part);
}

// Whether the environment variable `name` is 1 (every part) or a comma-separated list holding `part`.
inline bool env_lists(const char* name, std::string_view part) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  if (std::string_view(v) == "1") return true;
  const std::vector<std::string_view> ps = cuda_switches::parts(v);
  return std::find(ps.begin(), ps.end(), part) != ps.end();
}

// GPT_ATTENTION_WGMMA_WG2 (read at each launch): 1 for every kernel, or a comma-separated list of `part`s (fwd, kv,
// dq) whose blocks are two warpgroups sharing their K/V (fwd), Q/dO (kv) or K (dq) tiles; the same values.
inline bool two_warpgroups(std::string_view part) { return env_lists("GPT_ATTENTION_WGMMA_WG2", part); }

// GPT_ATTENTION_WGMMA_RS (read at each launch; an experiment not yet measured on a GPU): 1 for both, or a list of
// `part`s (fwd, kv) whose tile that every product of the block multiplies (the forward's Q; the dK/dV kernel's K and
// V) is read from shared memory once into registers, as the A fragments of S = Q K^T (S^T = K Q^T, dP^T = V dO^T).
// A wgmma with A in shared memory reads it again each time: at N = 64 half of S's shared-memory reads, at the dK/dV
// kernel's N = 32 two thirds, and at 64 x 64 tiles the tensor cores want about as many bytes per cycle as shared
// memory gives. The cost: 16 registers per tile held (4 blocks per SM for the forward instead of 5, 3 for the dK/dV
// kernel instead of 4). With one warpgroup, without OVERLAP and BK=128 (which take precedence); the same values.
inline bool registers_enabled(std::string_view part) { return env_lists("GPT_ATTENTION_WGMMA_RS", part); }

}  // namespace gpt::cuda::attention_wgmma_detail
