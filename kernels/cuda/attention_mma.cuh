// attention_mma.cu's and attention_mma_backward.cu's shared part (their own, not an interface): the tile layouts, the
// fragment helpers for mma.sync m16n8k16 over shared-memory tiles, and the host checks. Read attention_mma.cu's
// opening comment first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma_ptx.cuh"

namespace gpt::cuda::attention_mma_detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

constexpr size_t align128(size_t x) { return (x + 127) / 128 * 128; }

// Shared layouts, in bytes (every tile 128-byte aligned). LD: a tile's row stride in bf16 elements.
// kRows: query rows per warp: kDefaultFwdRows, 32 (two 16-row m-tiles), or 16 at D = 128 with dropout; and 16 by the
// forward's choice at D <= 64 without dropout (attention_mma.cu's forward_rows16, the default there).
template <int D, bool kDrop>
constexpr int kDefaultFwdRows = D <= 64 || !kDrop ? 32 : 16;
template <int D, bool kDrop, int kRows = kDefaultFwdRows<D, kDrop>>
struct FwdCfg {
  // 16-row m-tiles per warp: with two, each K or V fragment feeds two products (half the shared-memory reads per
  // product); one where registers do not allow two (with dropout at D = 128, ptxas spilled).
  static constexpr int MT = kRows / 16;
  static constexpr bool kKeepQ = D <= 64;  // Q's A fragments in registers (else read from shared memory per tile)
  static constexpr int BQ = kWarps * 16 * MT, BK = 64, LD = D + 8;
  static constexpr size_t kTile = align128(sizeof(bf16) * BK * LD);  // one K or V tile
  static constexpr size_t kQ = 0;
  static constexpr size_t kKV = align128(sizeof(bf16) * BQ * LD);  // stage s: K at kKV + 2 s kTile, V after it
  static constexpr size_t kBytes = kKV + 4 * kTile;
};

// kLean (the default at D <= 64 without dropout; attention_mma_backward.cu's backward_blocks3): 32-query tiles and K, V
// read from shared memory at every head size, as at D = 128, for fewer registers.
template <int D, bool kLean = false>
struct BwdKvCfg {
  static constexpr int BK = kWarps * 16, BQ = D <= 64 && !kLean ? 64 : 32, LD = D + 8;
  static constexpr bool kKeep = D <= 64 && !kLean;  // K, V as A fragments in registers (else read from shared memory)
  static constexpr size_t kKTile = align128(sizeof(bf16) * BK * LD), kQTile = align128(sizeof(bf16) * BQ * LD);
  static constexpr size_t kK = 0, kV = kKTile;
  // stage s: Q at kStage + s kStageBytes, dO after it, then lse (times log2 e) and D, BQ floats each
  static constexpr size_t kStage = 2 * kKTile;
  static constexpr size_t kStageBytes = 2 * kQTile + align128(2 * sizeof(float) * BQ);
  static constexpr size_t kBytes = kStage + 2 * kStageBytes;
};

template <int D>
struct BwdQCfg {
  static constexpr int BQ = kWarps * 16, BK = 64, LD = D + 8;
  static constexpr bool kKeep = D <= 64;  // Q, dO as A fragments in registers
  static constexpr size_t kTile = align128(sizeof(bf16) * 64 * LD);
  static constexpr size_t kQ = 0, kDo = kTile;
  static constexpr size_t kKV = 2 * kTile;  // stage s: K at kKV + 2 s kTile, V after it
  static constexpr size_t kBytes = kKV + 4 * kTile;
};

// The dQ kernel over the kept dS^T (attention_backward_q_ds): per stage a dS^T tile (BK keys x BQ queries, rows of
// BQ + 8) and a K tile (BK x D, rows of D + 8); two stages.
template <int D>
struct BwdQDsCfg {
  static constexpr int BQ = kWarps * 16, BK = 64, LD = D + 8, LDS = BQ + 8;
  static constexpr size_t kDsTile = align128(sizeof(bf16) * BK * LDS), kKTile = align128(sizeof(bf16) * BK * LD);
  static constexpr size_t kStageBytes = kDsTile + kKTile;
  static constexpr size_t kBytes = 2 * kStageBytes;
};

// Rows [row0, row0 + ROWS) x [0, D) of a bf16 matrix with row stride ld (elements) into a shared tile of row stride
// LD, by cp.async in 16-byte pieces (consecutive threads on consecutive pieces of a row); rows at or past `rows`
// are zero-filled (their source, row0's, is not read). Thread t (of the block's kThreads) copies piece t % kPieces of
// rows t / kPieces + j kThreads / kPieces: a loop of fixed count, unrolled (from threadIdx.x in steps of kThreads,
// a trip count ptxas cannot know, it was a runtime loop).
template <int ROWS, int D, int LD>
__device__ inline void copy_tile_async(bf16* dst, const bf16* src, int64_t ld, int row0, int rows) {
  constexpr int kPieces = D / 8;
  static_assert(ROWS * kPieces % kThreads == 0 && kThreads % kPieces == 0);
#ifdef GPT_CUDA_EMULATOR
  if (blockDim.x != kThreads) emu_fail("copy_tile_async: a block of other than kThreads threads");
#endif
  const int r0 = static_cast<int>(threadIdx.x) / kPieces, c = (static_cast<int>(threadIdx.x) % kPieces) * 8;
#pragma unroll
  for (int j = 0; j < ROWS * kPieces / kThreads; ++j) {
    const int r = r0 + j * (kThreads / kPieces), row = row0 + r;
    const bool in = row < rows;
    cp_async_16(dst + r * LD + c, src + (in ? static_cast<int64_t>(row) * ld : 0) + c, in ? 16u : 0u);
  }
}

// ldmatrix row addresses in a tile of row stride LD, for lane = 8 i + j:
//  - a_row: the A fragment of rows [r0, r0 + 16) x columns [c0, c0 + 16); with ldmatrix_x4_trans, the B fragments
//    of a (k = rows, n = columns) row-major tile: registers {0, 1} for columns c0.., {2, 3} for c0 + 8..
//  - b_row: with ldmatrix_x4, the B fragments of B = tile^T for the 16 tile rows r0.. (n) x columns c0.. (k):
//    registers {0, 1} for rows r0.., {2, 3} for rows r0 + 8..
template <int LD>
__device__ inline const bf16* a_row(const bf16* tile, int r0, int c0, int lane) {
  const int i = lane >> 3, j = lane & 7;
  return tile + (r0 + j + 8 * (i & 1)) * LD + c0 + 8 * (i >> 1);
}
template <int LD>
__device__ inline const bf16* b_row(const bf16* tile, int r0, int c0, int lane) {
  const int i = lane >> 3, j = lane & 7;
  return tile + (r0 + j + 8 * (i >> 1)) * LD + c0 + 8 * (i & 1);
}

// The A fragment over 16 columns [16 c, 16 c + 16) of a warp's accumulator row block, from its two m16n8 tiles
// 2c and 2c + 1 (already final values), rounded to bf16.
__device__ inline void pack_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// Every element of a warp's m16n8 accumulator tiles to 0.
template <int N>
__device__ inline void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
  }
}

// The warp's A fragments of rows [r0, r0 + 16) x all D = 16 KD channels of the tiles t1 and t2, kept in registers
// across the streamed tiles (the backward kernels' kKeep).
template <int KD, int LD>
__device__ inline void load_a_pair(uint32_t (&f1)[KD][4], uint32_t (&f2)[KD][4], const bf16* t1, const bf16* t2, int r0,
                                   int lane) {
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    ldmatrix_x4(f1[kk], a_row<LD>(t1, r0, kk * 16, lane));
    ldmatrix_x4(f2[kk], a_row<LD>(t2, r0, kk * 16, lane));
  }
}

// The backward kernels' two score products for the warp's 16 rows, over all D = 16 KD channels: s = A1 B1^T and
// d = A2 B2^T for the 16-row chunks c in [c_lo, c_hi) of the streamed tiles b1, b2 (each chunk two n-tiles; the
// others stay 0). A1, A2: rows r0.. of the tiles a1, a2, from k1, k2 (load_a_pair's) where kKeep, else read per
// 16 channels. dK/dV: S^T = K Q^T and dP^T = V dO^T; dQ: S = Q K^T and dP = dO V^T.
template <int KD, int NC, int LD, bool kKeep>
__device__ inline void score_products(float (&s)[2 * NC][4], float (&d)[2 * NC][4],
                                      const uint32_t (&k1)[kKeep ? KD : 1][4], const uint32_t (&k2)[kKeep ? KD : 1][4],
                                      const bf16* a1, const bf16* a2, int r0, const bf16* b1, const bf16* b2, int c_lo,
                                      int c_hi, int lane) {
  zero(s);
  zero(d);
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    uint32_t f1[4], f2[4];
    if constexpr (kKeep) {
#pragma unroll
      for (int e = 0; e < 4; ++e) f1[e] = k1[kk][e], f2[e] = k2[kk][e];
    } else {
      ldmatrix_x4(f1, a_row<LD>(a1, r0, kk * 16, lane));
      ldmatrix_x4(f2, a_row<LD>(a2, r0, kk * 16, lane));
    }
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (c < c_lo || c >= c_hi) continue;
      uint32_t x1[4], x2[4];  // B1^T, B2^T for rows 16 c.. (two n-tiles) x channels 16 kk..
      ldmatrix_x4(x1, b_row<LD>(b1, c * 16, kk * 16, lane));
      ldmatrix_x4(x2, b_row<LD>(b2, c * 16, kk * 16, lane));
      mma_bf16_16816(s[2 * c], f1, x1[0], x1[1]);
      mma_bf16_16816(s[2 * c + 1], f1, x1[2], x1[3]);
      mma_bf16_16816(d[2 * c], f2, x2[0], x2[1]);
      mma_bf16_16816(d[2 * c + 1], f2, x2[2], x2[3]);
    }
  }
}

// The dQ kernels' product: dq (the warp's 16 query rows x D) += dS (A fragment: those rows x keys 16 c..) K (rows
// 16 c.. of the K tile sk).
template <int D, int LD>
__device__ inline void add_ds_k(float (&dq)[D / 8][4], const uint32_t (&dsa)[4], const bf16* sk, int c, int lane) {
#pragma unroll
  for (int d2 = 0; d2 < D / 16; ++d2) {
    uint32_t kb[4];  // K for keys 16 c.. x channels 16 d2.. (two n-tiles)
    ldmatrix_x4_trans(kb, a_row<LD>(sk, c * 16, d2 * 16, lane));
    mma_bf16_16816(dq[2 * d2], dsa, kb[0], kb[1]);
    mma_bf16_16816(dq[2 * d2 + 1], dsa, kb[2], kb[3]);
  }
}

// The dK/dV kernels' per-query values of a query tile: lse * log2 e and D of row threadIdx.x < BQ (0 past T), loaded
// into registers a tile ahead (so their loads' latency overlaps a tile's products) and stored into the tile's stage
// later.
template <int BQ>
struct QueryRowStats {
  float lse = 0.0f, dv = 0.0f;
  __device__ void load(const float* lse_bh, const float* dvec_bh, int qt, int T) {
    static_assert(BQ <= kThreads);
    const int t = qt * BQ + static_cast<int>(threadIdx.x);
    const bool in = static_cast<int>(threadIdx.x) < BQ && t < T;
    lse = in ? lse_bh[t] * kLog2e : 0.0f;
    dv = in ? dvec_bh[t] : 0.0f;
  }
  __device__ void store(float* slse, float* sdv) const {
    if (static_cast<int>(threadIdx.x) < BQ) slse[threadIdx.x] = lse, sdv[threadIdx.x] = dv;
  }
};

// f(std::true_type{}) (the masked copy of a tile's element-wise code), or f(std::false_type{}) (the unmasked copy)
// where kAllowed and `unmasked` (warp-uniform: the tile is wholly visible to the warp). kAllowed false compiles no
// unmasked copy at all.
template <bool kAllowed, typename F>
__device__ inline void with_mask(bool unmasked, F&& f) {
  if constexpr (kAllowed) {
    if (unmasked) {
      f(std::false_type{});
      return;
    }
  }
  f(std::true_type{});
}

// A warp's accumulators of `rows` x D (m-tiles of 16 rows; acc[m][n] the m16n8 tile of columns 8 n..), times
// `mul`, as bf16 into global rows row0.. (row stride ld), those below T only, staged through the warp's own
// `rows` rows of the shared tile `stage` (row stride LD) for 16-byte stores.
template <int MT, int D, int LD>
__device__ inline void store_rows(bf16* dst, int64_t ld, const float (&acc)[MT][D / 8][4], float mul, bf16* stage,
                                  int row0, int T, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        *reinterpret_cast<uint32_t*>(stage + (mt * 16 + g + 8 * hf) * LD + n * 8 + 2 * t) =
            pack_bf16x2(acc[mt][n][2 * hf] * mul, acc[mt][n][2 * hf + 1] * mul);
      }
    }
  }
  __syncwarp();
  constexpr int kPieces = D / 8;
  for (int i = lane; i < MT * 16 * kPieces; i += kWarp) {
    const int r = i / kPieces, c = (i % kPieces) * 8;
    if (row0 + r < T) {
      *reinterpret_cast<uint4*>(dst + static_cast<int64_t>(row0 + r) * ld + c) =
          *reinterpret_cast<const uint4*>(stage + r * LD + c);
    }
  }
  __syncwarp();
}

// After store_rows (MT 1, D 64): the column sums of the rows it stored (those below T), as stored (bf16), into
// partial[0, 64): lane l adds columns 2 l and 2 l + 1 over the warp's 16 staged rows in order. The staging rows may be
// rewritten after it returns.
template <int LD>
__device__ inline void stored_column_sums(float* partial, const bf16* stage, int row0, int T, int lane) {
  float lo = 0.0f, hi = 0.0f;
#pragma unroll 4
  for (int r = 0; r < 16; ++r) {
    if (row0 + r < T) {
      lo += load_value(stage + r * LD + 2 * lane);
      hi += load_value(stage + r * LD + 2 * lane + 1);
    }
  }
  *reinterpret_cast<float2*>(partial + 2 * lane) = make_float2(lo, hi);
  __syncwarp();  // every lane's reads of the staging rows before any lane's next writes
}

// Validates the shape; returns the head size.
inline int check_shape(int B, int T, int C, int NH) {
  GPT_CHECK(B >= 0 && T >= 0);
  GPT_CHECK(attention_mma_supported(C, NH));
  GPT_CHECK(static_cast<int64_t>(B) * NH <= 65535);  // gridDim.y
  return C / NH;
}

// The kernels for more blocks per SM than the driver's default shared-memory carveout gave the 2-block ones (135 KB on
// the H200) ask for the most shared memory.
template <typename Kernel>
void prefer_shared_memory(Kernel kernel) {
  GPT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

}  // namespace gpt::cuda::attention_mma_detail
