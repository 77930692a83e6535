// attention_wgmma.cu's and attention_wgmma_backward.cu's shared part (their own, not an interface): the tile
// sizes, the backward's shared-memory layout, the swizzled tile copy and the switches. Read attention_wgmma.cu's
// opening comment first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace gpt::cuda::attention_wgmma_detail {

using namespace attention_mma_detail;

constexpr int kD = 64, kBQ = 64, kBK = 64;
constexpr uint32_t kTile = 64 * kSw128Row;          // one 64 x 64 bf16 tile: 8 KB
constexpr size_t kSmem = 5 * size_t{kTile} + 1024;  // the forward: Q, two stages of K and V, 1 KB to align
constexpr int kStageLd = kD + 8;                    // the output's staging rows (store_rows), in the dead K/V stages

// The dK/dV kernel's shared memory past the K and V tiles: per stage a Q and a dO tile (BQ swizzled rows), then lse
// and D (BQ floats each), rounded up to keep the next stage 1024-byte aligned; two stages.
template <int BQ>
struct BwdKvWgmmaCfg {
  static constexpr uint32_t kQTile = BQ * kSw128Row;
  static constexpr uint32_t kStageBytes = (2 * kQTile + 2 * sizeof(float) * BQ + 1023) / 1024 * 1024;
  static constexpr size_t kBytes = 2 * size_t{kTile} + 2 * size_t{kStageBytes} + 1024;
};

// Rows [row0, row0 + ROWS) x 64 channels of a bf16 matrix with row stride ld into a swizzled tile, by cp.async (16
// bytes each; rows at or past `rows` zero-filled, their source not read).
template <int ROWS = 64>
__device__ inline void copy_tile_sw128(unsigned char* dst, const bf16* src, int64_t ld, int row0, int rows) {
  for (int i = threadIdx.x; i < ROWS * 8; i += kThreads) {
    const int r = i / 8, c = (i % 8) * 8, row = row0 + r;
    const bool in = row < rows;
    cp_async_16(dst + sw128_offset(r, c), src + (in ? static_cast<int64_t>(row) * ld : 0) + c, in ? 16u : 0u);
  }
}

// GPT_ATTENTION_WGMMA_OVERLAP (read at each launch): 1 for both overlapped kernels, or `part` (fwd, bwd) for one.
inline bool overlap_enabled(const char* part) {
  return env_is("GPT_ATTENTION_WGMMA_OVERLAP", "1") || env_is("GPT_ATTENTION_WGMMA_OVERLAP", part);
}

}  // namespace gpt::cuda::attention_wgmma_detail
