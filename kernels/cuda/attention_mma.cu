// Fused causal attention on the tensor cores through mma.sync m16n8k16 (mma_ptx.cuh), FlashAttention-2 style: the
// math, arguments, lse state, dropout mask and deterministic three-kernel backward of attention_tc.cu (read that
// file and attention.cu first; this one says what differs).
//  - The fragments' register layout is the PTX ISA's (mma_ptx.cuh), so each thread knows which (row, column) every
//    accumulator element is: masks, dropout and the online softmax work on registers. The accumulators of S (or
//    dP) over 16 keys, rounded to bf16 pairwise, are the A fragment of the next product: P, P Z and dS never go
//    through shared memory (attention_tc.cu writes S and P to per-warp tiles).
//  - A row's softmax statistics come from its four lanes (lane = 4 g + t holds rows g and g + 8): two shuffles for
//    the max; l stays a per-lane partial sum until the end, as FlashAttention-2 keeps it.
//  - bf16 tiles in shared memory have rows of D + 8 elements (16 bytes of padding): ldmatrix's eight row addresses
//    of one matrix then fall in distinct banks. Tiles come from global memory by cp.async, 16 bytes per copy,
//    zero-filled past T; the streamed operand (K, V in the forward and the dQ kernel; Q, dO in the dK/dV kernel)
//    is double-buffered: the next tile's copies are in flight while this one is computed.
//  - Every block has 4 warps; each warp owns whole rows of the products it accumulates (32 query rows in the
//    forward, 16 with dropout at D = 128; 16 keys in dK/dV, 16 queries in dQ), so sums run in a fixed order and no
//    two warps write one element: deterministic, no atomics. The forward keeps Q's fragments in registers at
//    D <= 64 and reads them from shared memory per tile at D = 128, as FlashAttention-2 does there.
//  - The backward takes dO in bf16 (the model's; CudaBackend rounds an fp32 one first) and first writes
//    D = rowsum(dO * O), so the main kernels copy bf16 tiles only. lse is read as lse * log2(e), and the kernels
//    exponentiate with exp2f.
//  - Work above the diagonal is skipped 16 keys at a time (P and dS there are zero), as in attention_tc.cu. Tiles
//    wholly below it for a warp (most of them) take a copy of the softmax / dS code without the per-element mask,
//    as FlashAttention-2 separates its masking iterations (not with dropout, nor in the D = 128 forward: there
//    ptxas spilled). The same math; in the unmasked copy the compiler may fuse the scaling into the exponent's
//    argument (an FMA: the last bit of P's fp32 value may differ, far below its bf16 rounding). Pinning it with
//    __fmul_rn cost registers (D = 64 forward: 239 -> 253).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

constexpr size_t align128(size_t x) { return (x + 127) / 128 * 128; }

// Shared layouts, in bytes (every tile 128-byte aligned). LD: a tile's row stride in bf16 elements.
// kRows: query rows per warp, 32 (two 16-row m-tiles) by default; 16 at D = 128 with dropout, and on request (below).
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

// kLean (the default at D <= 64 without dropout; backward_blocks3 below): 32-query tiles and K, V read from shared
// memory at every head size, as at D = 128, for fewer registers.
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
// are zero-filled (their source, row0's, is not read).
template <int ROWS, int D, int LD>
__device__ inline void copy_tile_async(bf16* dst, const bf16* src, int64_t ld, int row0, int rows) {
  constexpr int kPieces = D / 8;
  for (int i = threadIdx.x; i < ROWS * kPieces; i += kThreads) {
    const int r = i / kPieces, c = (i % kPieces) * 8, row = row0 + r;
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

// The forward's body, for the kernels below.
template <int D, bool kDrop, int kRows>
__device__ __forceinline__ void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH,
                                                      float scale_log2, DropoutMask drop, float keep) {
  using Cfg = FwdCfg<D, kDrop, kRows>;
  constexpr int MT = Cfg::MT, BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD;
  constexpr bool kUnmaskedPath = !kDrop && D <= 64;
  constexpr int KD = D / 16, ND = D / 8, NC = BK / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kQ);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the last query tiles have the most keys: start them first
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const bf16* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile

  auto stage_k = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + Cfg::kKV + 2 * s * Cfg::kTile); };
  auto stage_v = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + Cfg::kKV + (2 * s + 1) * Cfg::kTile); };
  copy_tile_async<BQ, D, LD>(sq, q, C3, q0, T);
  copy_tile_async<BK, D, LD>(stage_k(0), k, C3, 0, T);
  copy_tile_async<BK, D, LD>(stage_v(0), v, C3, 0, T);
  cp_async_commit();

  const int qr = warp * 16 * MT, qw = q0 + qr;  // this warp's first row (in the tile, in the sequence)
  const int last = qw + 16 * MT - 1;            // and its last
  constexpr bool kKeepQ = Cfg::kKeepQ;
  uint32_t qa[kKeepQ ? MT : 1][kKeepQ ? KD : 1][4];
  float o[MT][ND][4];
  float m[MT][2], l[MT][2];  // per row (g, g + 8 of each m-tile): running max (log2 units) and partial sum
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero(o[mt]);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) m[mt][hf] = -INFINITY, l[mt][hf] = 0.0f;
  }

  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK, s = kt & 1;
    if (kt + 1 < num_kt) {  // stage s ^ 1 was last read in iteration kt - 1, which ended with a barrier
      copy_tile_async<BK, D, LD>(stage_k(s ^ 1), k, C3, k0 + BK, T);
      copy_tile_async<BK, D, LD>(stage_v(s ^ 1), v, C3, k0 + BK, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of tile kt (and of Q) have landed
    if constexpr (kKeepQ) {
      if (kt == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int kk = 0; kk < KD; ++kk) ldmatrix_x4(qa[mt][kk], a_row<LD>(sq, qr + mt * 16, kk * 16, lane));
        }
      }
    }
    // 16-key chunks c < nc hold a key <= the warp's last row (none for a warp past T or before k0): warp-uniform.
    const int nc = qw >= T || last < k0 ? 0 : min(NC, (last - k0) / 16 + 1);
    if (nc > 0) {
      const bf16* sk = stage_k(s);
      const bf16* sv = stage_v(s);
      float sc[MT][2 * NC][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) zero(sc[mt]);
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t qf[MT][4];  // Q for the warp's rows x channels 16 kk..
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kKeepQ) {
#pragma unroll
            for (int e = 0; e < 4; ++e) qf[mt][e] = qa[mt][kk][e];
          } else {
            ldmatrix_x4(qf[mt], a_row<LD>(sq, qr + mt * 16, kk * 16, lane));
          }
        }
#pragma unroll
        for (int c = 0; c < NC; ++c) {
          if (c >= nc) continue;
          uint32_t kb[4];  // K^T for keys 16 c.. (two n-tiles) x channels 16 kk..
          ldmatrix_x4(kb, b_row<LD>(sk, c * 16, kk * 16, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16_16816(sc[mt][2 * c], qf[mt], kb[0], kb[1]);
            mma_bf16_16816(sc[mt][2 * c + 1], qf[mt], kb[2], kb[3]);
          }
        }
      }
      uint32_t pa[MT][NC][4];
      // The online softmax of this tile's scores into pa. kMasked: the causal mask and the padded rows; without it
      // (a tile whose every key precedes the warp's every row, all of them real: most tiles) no test per element.
      auto softmax = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float alpha[2];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int t = qw + mt * 16 + g + 8 * hf;
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < 2 * NC; ++n) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int t2 = k0 + n * 8 + 2 * tq + e;
                float& x = sc[mt][n][2 * hf + e];  // the raw score: the scale goes into exp2's FFMA below
                if (kMasked && !(n < 2 * nc && t2 <= t)) x = -INFINITY;
                mx = fmaxf(mx, x);
              }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            // Finite from the first tile on: key 0 is visible to every row. All four lanes of a row agree bitwise.
            // The scale is positive, so the scaled maximum is the maximum of the scaled scores, bit for bit.
            const float m_new = fmaxf(m[mt][hf], mx * scale_log2);
            alpha[hf] = exp2f(m[mt][hf] - m_new);  // 0 on the first tile (m = -inf)
            float sum = 0.0f;
            const uint64_t row_first = first + static_cast<uint64_t>(t) * T;  // mask index of (t, 0)
#pragma unroll
            for (int n = 0; n < 2 * NC; ++n) {
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                float& x = sc[mt][n][2 * hf + e];
                const float p = exp2f(fmaf(x, scale_log2, -m_new));  // 0 where masked (-inf); one rounding
                sum += p;
                const int t2 = k0 + n * 8 + 2 * tq + e;
                // Padded rows (t >= T) are never written: skip their RNG draws.
                x = kDrop && (!kMasked || (t2 <= t && t < T)) ? p * dropout_factor(drop, keep, row_first + t2) : p;
              }
            }
            l[mt][hf] = l[mt][hf] * alpha[hf] + sum;  // normaliser of the undropped, unrounded P
            m[mt][hf] = m_new;
          }
#pragma unroll
          for (int n = 0; n < ND; ++n) {
            o[mt][n][0] *= alpha[0], o[mt][n][1] *= alpha[0];
            o[mt][n][2] *= alpha[1], o[mt][n][3] *= alpha[1];
          }
#pragma unroll
          for (int c = 0; c < NC; ++c) pack_a(pa[mt][c], sc[mt][2 * c], sc[mt][2 * c + 1]);
        }
      };
      // Padded rows (past T) need no mask: they are never stored. The unmasked copy only where ptxas keeps both in
      // registers: with dropout (RNG state live too) and at D = 128 it spilled.
      with_mask<kUnmaskedPath>(k0 + BK - 1 <= qw, softmax);  // then nc == NC too
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        if (c >= nc) continue;
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t vb[4];  // V for keys 16 c.. x channels 16 dp.. (two n-tiles)
          ldmatrix_x4_trans(vb, a_row<LD>(sv, c * 16, dp * 16, lane));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16_16816(o[mt][2 * dp], pa[mt][c], vb[0], vb[1]);
            mma_bf16_16816(o[mt][2 * dp + 1], pa[mt][c], vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with stage s before iteration kt + 1 refills it
  }

  if (qw >= T) return;  // warp-uniform; no barrier follows
  float inv[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float sum = l[mt][hf];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[mt][hf] = 1.0f / sum;
      const int t = qw + mt * 16 + g + 8 * hf;
      if (tq == 0 && t < T) lse[static_cast<int64_t>(bh) * T + t] = (m[mt][hf] + log2f(sum)) * kLn2;
    }
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[mt][n][0] *= inv[mt][0], o[mt][n][1] *= inv[mt][0];
      o[mt][n][2] *= inv[mt][1], o[mt][n][3] *= inv[mt][1];
    }
  }
  // The warp's own rows of the Q tile (read only by this warp, and no more) stage its output.
  store_rows<MT, D, LD>(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D, C, o, 1.0f, sq + qr * LD,
                        qw, T, lane);
}

template <int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    attention_forward_mma_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH, float scale_log2,
                                 DropoutMask drop, float keep) {
  attention_forward_mma<D, kDrop, kDefaultFwdRows<D, kDrop>>(out, lse, qkv, T, C, NH, scale_log2, drop, keep);
}

// 16 rows per warp (D <= 64, no dropout: forward_rows16 below): ptxas fits it in 127 registers for 4 blocks
// per SM (sm_90, no spills), where 32 rows take 239 and allow 2.
template <int D>
__global__ void __launch_bounds__(kThreads, 4)
    attention_forward_mma16_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH, float scale_log2,
                                   DropoutMask drop, float keep) {
  attention_forward_mma<D, false, 16>(out, lse, qkv, T, C, NH, scale_log2, drop, keep);
}

// D(B,NH,T) = rowsum(dO * O) over each head's channels (bf16 dO and O; fp32 sums in a fixed order). Each row (b, t,
// h) takes hs / 4 lanes (a power of two: hs is 32, 64 or 128), each lane 4 channels, so a warp holds 32 / (hs / 4)
// rows and every lane is busy (one row per warp left half of them idle at hs 64). The row's sum is the xor tree over
// its lanes: the sum one row per warp gave, but for the sign of a zero.
__global__ void attention_prep_mma_kernel(float* dvec, const bf16* dout, const bf16* out, int64_t rows, int T, int C,
                                          int NH, int hs) {
  const int lanes = hs / 4, lane = threadIdx.x % kWarp, sub = lane % lanes;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int64_t row = warp * (kWarp / lanes) + lane / lanes;
  const bool in = row < rows;  // every lane stays for the shuffles
  const int64_t bt = row / NH;
  const int h = static_cast<int>(row % NH);
  const int64_t off = bt * C + static_cast<int64_t>(h) * hs + sub * 4;
  float acc = 0.0f;
  if (in) {
    float d[4], o[4];
    load4_values(d, dout + off);
    load4_values(o, out + off);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc = fmaf(d[e], o[e], acc);
  }
  for (int o = lanes / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);  // inside the row's lanes
  if (in && sub == 0) {
    const int64_t b = bt / T, t = bt % T;
    dvec[(b * NH + h) * T + t] = acc;
  }
}

// dK, dV for one 64-key tile of one (b, h); warp w owns keys k0 + 16 w.. and sums over the query tiles in
// ascending order, on transposed scores S^T = K Q^T (keys x queries), as attention_tc.cu.
// kStoreDs: also dS^T (not yet times scale, bf16 as the dK product takes it) into ds (row stride ds_ld; rows: keys,
// columns: queries; this (b, h)'s block first) for attention_backward_q_ds, each 16 x 16 block at or below the
// diagonal (the masked elements of the diagonal's blocks 0), no other.
template <int D, bool kDrop, bool kLean, bool kStoreDs = false>
__device__ __forceinline__ void attention_backward_kv_mma(bf16* dqkv, const bf16* dob, const bf16* qkv,
                                                          const float* lse, const float* dvec, int T, int C, int NH,
                                                          float scale, float scale_log2, DropoutMask drop, float keep,
                                                          bf16* ds = nullptr, int64_t ds_ld = 0) {
  using Cfg = BwdKvCfg<D, kLean>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD, KD = D / 16, ND = D / 8, NC = BQ / 16;
  constexpr bool kKeep = Cfg::kKeep;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sk = reinterpret_cast<bf16*>(smem_raw + Cfg::kK);
  bf16* sv = reinterpret_cast<bf16*>(smem_raw + Cfg::kV);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.x * BK;  // the first key tiles see the most queries: start them first
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const bf16* q = qkv + qkv_off;
  const bf16* dO = dob + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* dvec_bh = dvec + static_cast<int64_t>(bh) * T;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  auto stage = [&](int s) { return smem_raw + Cfg::kStage + s * Cfg::kStageBytes; };
  auto stage_q = [&](int s) { return reinterpret_cast<bf16*>(stage(s)); };
  auto stage_do = [&](int s) { return reinterpret_cast<bf16*>(stage(s) + Cfg::kQTile); };
  auto stage_lse = [&](int s) { return reinterpret_cast<float*>(stage(s) + 2 * Cfg::kQTile); };
  auto stage_dv = [&](int s) { return stage_lse(s) + BQ; };
  // Query tile qt's Q and dO into stage s (cp.async); its lse * log2 e and D (row threadIdx.x < BQ; 0 past T) into
  // registers first, to be stored into the stage later, so their loads' latency overlaps a tile's products.
  static_assert(BQ <= kThreads);
  auto fetch_tiles = [&](int qt, int s) {
    copy_tile_async<BQ, D, LD>(stage_q(s), q, C3, qt * BQ, T);
    copy_tile_async<BQ, D, LD>(stage_do(s), dO, C, qt * BQ, T);
  };
  float row_lse = 0.0f, row_dv = 0.0f;
  auto load_rows = [&](int qt) {
    const int t = qt * BQ + static_cast<int>(threadIdx.x);
    const bool in = static_cast<int>(threadIdx.x) < BQ && t < T;
    row_lse = in ? lse_bh[t] * kLog2e : 0.0f;
    row_dv = in ? dvec_bh[t] : 0.0f;
  };
  auto store_rows_to = [&](int s) {
    if (static_cast<int>(threadIdx.x) < BQ) stage_lse(s)[threadIdx.x] = row_lse, stage_dv(s)[threadIdx.x] = row_dv;
  };
  const int qt0 = k0 / BQ, num_qt = (T + BQ - 1) / BQ;  // from the tile holding query k0 (the diagonal) down
  copy_tile_async<BK, D, LD>(sk, q + C, C3, k0, T);
  copy_tile_async<BK, D, LD>(sv, q + 2 * C, C3, k0, T);
  fetch_tiles(qt0, 0);
  cp_async_commit();
  load_rows(qt0);
  store_rows_to(0);

  const int kr = warp * 16, kw = k0 + kr;  // this warp's first key (in the tile, in the sequence)
  uint32_t ka[kKeep ? KD : 1][4], va[kKeep ? KD : 1][4];
  float dk[1][ND][4], dv[1][ND][4];
  zero(dk[0]);
  zero(dv[0]);

  for (int qt = qt0; qt < num_qt; ++qt) {
    const int q0 = qt * BQ, s = (qt - qt0) & 1;
    if (qt + 1 < num_qt) {  // stage s ^ 1 was last read in the previous iteration, which ended with a barrier
      fetch_tiles(qt + 1, s ^ 1);
      cp_async_commit();
      load_rows(qt + 1);  // stored into stage s ^ 1 at the end of this iteration
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of this tile (and of K, V) have landed
    if constexpr (kKeep) {
      if (qt == qt0) load_a_pair<KD, LD>(ka, va, sk, sv, kr, lane);
    }
    // 16-query chunks c >= c_lo end at or after the warp's first key (the others are all masked): warp-uniform.
    const int c_lo = kw > q0 ? (kw - q0) / 16 : 0;
    if (kw < T && c_lo < NC) {
      const bf16* sq = stage_q(s);
      const bf16* sdo = stage_do(s);
      const float* slse = stage_lse(s);
      const float* sdv = stage_dv(s);
      float st[2 * NC][4], dpt[2 * NC][4];
      score_products<KD, NC, LD, kKeep>(st, dpt, ka, va, sk, sv, kr, sq, sdo, c_lo, NC, lane);
      // P^T Z into st and dS^T (not yet times scale) into dpt, element by element: key row r, query column col.
      // kMasked: the causal mask and the padded queries; without it (every query of the tile real and at or after
      // the warp's every key: most tiles) no test per element.
      auto scores_to_ds = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int n = 0; n < 2 * NC; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = g + 8 * (e >> 1), col = n * 8 + 2 * tq + (e & 1);
            const int t = q0 + col, t2 = kw + r;
            const bool visible = !kMasked || (n >= 2 * c_lo && t < T && t2 <= t);
            const float p = visible ? exp2f(st[n][e] * scale_log2 - slse[col]) : 0.0f;
            const float z =
                visible && kDrop ? dropout_factor(drop, keep, first + static_cast<uint64_t>(t) * T + t2) : 1.0f;
            st[n][e] = p * z;
            dpt[n][e] = p * (z * dpt[n][e] - sdv[col]);
          }
        }
      };
      // Padded queries would add nothing (zero-filled, lse and D 0) but stay masked, as a defence. With dropout
      // ptxas spilled.
      with_mask<!kDrop>(kw + 15 <= q0 && q0 + BQ <= T, scores_to_ds);  // then c_lo == 0 too
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        if (c < c_lo) continue;
        uint32_t pa[4], dsa[4];
        pack_a(pa, st[2 * c], st[2 * c + 1]);
        pack_a(dsa, dpt[2 * c], dpt[2 * c + 1]);
        if constexpr (kStoreDs) {  // the A fragment's layout: {row g, g + 8} x {columns 2 tq, 8 + 2 tq}, pairs
          bf16* row = ds + (static_cast<int64_t>(bh) * ds_ld + kw + g) * ds_ld + q0 + c * 16 + 2 * tq;
          *reinterpret_cast<uint32_t*>(row) = dsa[0];
          *reinterpret_cast<uint32_t*>(row + 8 * ds_ld) = dsa[1];
          *reinterpret_cast<uint32_t*>(row + 8) = dsa[2];
          *reinterpret_cast<uint32_t*>(row + 8 * ds_ld + 8) = dsa[3];
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t ob[4], qb[4];  // dO, Q for queries 16 c.. x channels 16 dp.. (two n-tiles)
          ldmatrix_x4_trans(ob, a_row<LD>(sdo, c * 16, dp * 16, lane));
          ldmatrix_x4_trans(qb, a_row<LD>(sq, c * 16, dp * 16, lane));
          mma_bf16_16816(dv[0][2 * dp], pa, ob[0], ob[1]);
          mma_bf16_16816(dv[0][2 * dp + 1], pa, ob[2], ob[3]);
          mma_bf16_16816(dk[0][2 * dp], dsa, qb[0], qb[1]);
          mma_bf16_16816(dk[0][2 * dp + 1], dsa, qb[2], qb[3]);
        }
      }
    }
    if (qt + 1 < num_qt) store_rows_to(s ^ 1);  // published by the barrier below
    __syncthreads();  // everyone is done with stage s (and, after the last tile, with K and V)
  }

  if (kw >= T) return;  // warp-uniform; no barrier follows
  bf16* dk_out = dqkv + qkv_off + C;
  // The warp's own rows of the K tile (free now) stage its outputs.
  store_rows<1, D, LD>(dk_out, C3, dk, scale, sk + kr * LD, kw, T, lane);
  store_rows<1, D, LD>(dk_out + C, C3, dv, 1.0f, sk + kr * LD, kw, T, lane);
}

template <int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_mma_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                     int T, int C, int NH, float scale, float scale_log2, DropoutMask drop,
                                     float keep) {
  attention_backward_kv_mma<D, kDrop, false>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep);
}

// The lean configuration in at most 168 registers, for 3 blocks per SM (D 32 and 64 without dropout: sm_90 ptxas,
// 167 registers at D = 64, no spills, against 242).
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    attention_backward_kv_mma3_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                      int T, int C, int NH, float scale, float scale_log2, DropoutMask drop,
                                      float keep) {
  attention_backward_kv_mma<D, false, true>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep);
}

// The same, also writing dS^T for attention_backward_q_ds_kernel (ds: B NH blocks of ds_ld x ds_ld).
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    attention_backward_kv_ds_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                    int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep,
                                    bf16* ds, int64_t ds_ld) {
  attention_backward_kv_mma<D, false, true, true>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep,
                                                  ds, ds_ld);
}

// dQ for one 64-query tile of one (b, h); warp w owns queries q0 + 16 w.. and sums over the key tiles in
// ascending order.
template <int D, bool kDrop>
__device__ __forceinline__ void attention_backward_q_mma(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse,
                                                         const float* dvec, int T, int C, int NH, float scale,
                                                         float scale_log2, DropoutMask drop, float keep) {
  using Cfg = BwdQCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD, KD = D / 16, ND = D / 8, NC = BK / 16;
  constexpr bool kKeep = Cfg::kKeep;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kQ);
  bf16* sdo = reinterpret_cast<bf16*>(smem_raw + Cfg::kDo);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the last query tiles have the most keys: start them first
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const bf16* q = qkv + qkv_off;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const bf16* dO = dob + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile

  auto stage_k = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + Cfg::kKV + 2 * s * Cfg::kTile); };
  auto stage_v = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + Cfg::kKV + (2 * s + 1) * Cfg::kTile); };
  copy_tile_async<BQ, D, LD>(sq, q, C3, q0, T);
  copy_tile_async<BQ, D, LD>(sdo, dO, C, q0, T);
  copy_tile_async<BK, D, LD>(stage_k(0), k, C3, 0, T);
  copy_tile_async<BK, D, LD>(stage_v(0), v, C3, 0, T);
  cp_async_commit();

  const int qr = warp * 16, qw = q0 + qr;  // this warp's first query (in the tile, in the sequence)
  const int last = qw + 15;
  float lse2[2], dvr[2];  // rows g, g + 8: lse * log2 e and D (0 past T: those rows are masked)
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int t = qw + g + 8 * hf;
    lse2[hf] = t < T ? lse[static_cast<int64_t>(bh) * T + t] * kLog2e : 0.0f;
    dvr[hf] = t < T ? dvec[static_cast<int64_t>(bh) * T + t] : 0.0f;
  }
  uint32_t qa[kKeep ? KD : 1][4], doa[kKeep ? KD : 1][4];
  float dq[1][ND][4];
  zero(dq[0]);

  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK, s = kt & 1;
    if (kt + 1 < num_kt) {  // stage s ^ 1 was last read in iteration kt - 1, which ended with a barrier
      copy_tile_async<BK, D, LD>(stage_k(s ^ 1), k, C3, k0 + BK, T);
      copy_tile_async<BK, D, LD>(stage_v(s ^ 1), v, C3, k0 + BK, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of tile kt (and of Q, dO) have landed
    if constexpr (kKeep) {
      if (kt == 0) load_a_pair<KD, LD>(qa, doa, sq, sdo, qr, lane);
    }
    const int nc = qw >= T || last < k0 ? 0 : min(NC, (last - k0) / 16 + 1);
    if (nc > 0) {
      const bf16* sk = stage_k(s);
      const bf16* sv = stage_v(s);
      float sc[2 * NC][4], dp[2 * NC][4];
      score_products<KD, NC, LD, kKeep>(sc, dp, qa, doa, sq, sdo, qr, sk, sv, 0, nc, lane);
      // dS (not yet times scale) into dp, element by element: query row r, key column col. kMasked: the causal mask
      // and the padded rows; without it (every key of the tile before the warp's every row, all of them real: most
      // tiles) no test per element.
      auto scores_to_ds = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int n = 0; n < 2 * NC; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int hf = e >> 1, r = g + 8 * hf, col = n * 8 + 2 * tq + (e & 1);
            const int t = qw + r, t2 = k0 + col;
            const bool visible = !kMasked || (n < 2 * nc && t < T && t2 <= t);
            const float p = visible ? exp2f(sc[n][e] * scale_log2 - lse2[hf]) : 0.0f;
            const float z =
                visible && kDrop ? dropout_factor(drop, keep, first + static_cast<uint64_t>(t) * T + t2) : 1.0f;
            dp[n][e] = p * (z * dp[n][e] - dvr[hf]);
          }
        }
      };
      // Padded rows (past T) need no mask: they are never stored. With dropout ptxas spilled.
      with_mask<!kDrop>(k0 + BK - 1 <= qw, scores_to_ds);  // then nc == NC too
#pragma unroll
      for (int c = 0; c < NC; ++c) {
        if (c >= nc) continue;
        uint32_t dsa[4];
        pack_a(dsa, dp[2 * c], dp[2 * c + 1]);
#pragma unroll
        for (int d2 = 0; d2 < D / 16; ++d2) {
          uint32_t kb[4];  // K for keys 16 c.. x channels 16 d2.. (two n-tiles)
          ldmatrix_x4_trans(kb, a_row<LD>(sk, c * 16, d2 * 16, lane));
          mma_bf16_16816(dq[0][2 * d2], dsa, kb[0], kb[1]);
          mma_bf16_16816(dq[0][2 * d2 + 1], dsa, kb[2], kb[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with stage s before iteration kt + 1 refills it
  }

  if (qw >= T) return;  // warp-uniform; no barrier follows
  // The warp's own rows of the Q tile (read only by this warp) stage its output.
  store_rows<1, D, LD>(dqkv + qkv_off, C3, dq, scale, sq + qr * LD, qw, T, lane);
}

template <int D, bool kDrop>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_mma_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                    int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep) {
  attention_backward_q_mma<D, kDrop>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep);
}

// The same in at most 168 registers, for 3 blocks per SM (D = 64 without dropout: 168 against 175, no spills).
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    attention_backward_q_mma3_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                     int T, int C, int NH, float scale, float scale_log2, DropoutMask drop,
                                     float keep) {
  attention_backward_q_mma<D, false>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep);
}

// dQ for one 64-query tile of one (b, h) from the dS^T the dK/dV kernel kept (attention_backward_kv_ds_kernel): warp w
// owns queries q0 + 16 w.. and sums dS K over the key tiles in ascending order, one product instead of
// attention_backward_q_mma's four (no S, P or dP to recompute). Per key tile, the dS^T tile (keys x this tile's
// queries) and the K tile come in by cp.async, double-buffered; the A fragments of dS (queries x keys) are the
// transposes of the stored tile's 8 x 8 blocks (ldmatrix .trans at b_row's addresses). Only 16 x 16 blocks at or below
// the diagonal are used, all of which the dK/dV kernel wrote (its masked elements 0); the rest of a tile is copied
// but never read. The same dS values as attention_backward_q_mma's (its own recomputation may differ in the last bits
// of the fp32 dS before the bf16 rounding: S^T and S are different products).
template <int D>
__global__ void __launch_bounds__(kThreads, 4)
    attention_backward_q_ds_kernel(bf16* dqkv, const bf16* qkv, const bf16* ds, int64_t ds_ld, int T, int C, int NH,
                                   float scale) {
  using Cfg = BwdQDsCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD, LDS = Cfg::LDS, ND = D / 8, NC = BK / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  const int bh = blockIdx.y, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the last query tiles have the most keys: start them first
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const bf16* k = qkv + qkv_off + C;
  const bf16* ds_bh = ds + static_cast<int64_t>(bh) * ds_ld * ds_ld + q0;  // column q0 of row 0
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile

  auto stage_ds = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * Cfg::kStageBytes); };
  auto stage_k = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * Cfg::kStageBytes + Cfg::kDsTile); };
  // Rows of the dS^T tile past ds_ld are not read (zero-filled): ds_ld >= T rounded up to 64 holds every key tile.
  copy_tile_async<BK, BQ, LDS>(stage_ds(0), ds_bh, ds_ld, 0, static_cast<int>(ds_ld));
  copy_tile_async<BK, D, LD>(stage_k(0), k, C3, 0, T);
  cp_async_commit();

  const int qr = warp * 16, qw = q0 + qr;  // this warp's first query (in the tile, in the sequence)
  const int last = qw + 15;
  float dq[1][ND][4];
  zero(dq[0]);

  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK, s = kt & 1;
    if (kt + 1 < num_kt) {  // stage s ^ 1 was last read in iteration kt - 1, which ended with a barrier
      copy_tile_async<BK, BQ, LDS>(stage_ds(s ^ 1), ds_bh, ds_ld, k0 + BK, static_cast<int>(ds_ld));
      copy_tile_async<BK, D, LD>(stage_k(s ^ 1), k, C3, k0 + BK, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // every thread's copies of tile kt have landed
    // 16-key chunks c < nc start at or before the warp's last row: warp-uniform (none for a warp past T).
    const int nc = qw >= T || last < k0 ? 0 : min(NC, (last - k0) / 16 + 1);
    const bf16* sds = stage_ds(s);
    const bf16* sk = stage_k(s);
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      if (c >= nc) continue;
      uint32_t dsa[4];  // dS for the warp's 16 queries x keys 16 c..: the stored (key, query) blocks transposed
      ldmatrix_x4_trans(dsa, b_row<LDS>(sds, c * 16, qr, lane));
#pragma unroll
      for (int d2 = 0; d2 < D / 16; ++d2) {
        uint32_t kb[4];  // K for keys 16 c.. x channels 16 d2.. (two n-tiles)
        ldmatrix_x4_trans(kb, a_row<LD>(sk, c * 16, d2 * 16, lane));
        mma_bf16_16816(dq[0][2 * d2], dsa, kb[0], kb[1]);
        mma_bf16_16816(dq[0][2 * d2 + 1], dsa, kb[2], kb[3]);
      }
    }
    __syncthreads();  // everyone is done with stage s before iteration kt + 1 refills it
  }

  if (qw >= T) return;  // warp-uniform; no barrier follows
  // The warp's own 16 rows of stage 0's K tile (free after the last barrier) stage its output.
  store_rows<1, D, LD>(dqkv + qkv_off, C3, dq, scale, stage_k(0) + qr * LD, qw, T, lane);
}

// Validates the shape; returns the head size.
int check_shape(int B, int T, int C, int NH) {
  GPT_CHECK(B >= 0 && T >= 0);
  GPT_CHECK(attention_mma_supported(C, NH));
  GPT_CHECK(static_cast<int64_t>(B) * NH <= 65535);  // gridDim.y
  return C / NH;
}

// The occupancy experiments' kernels (below) are for more blocks per SM than the driver's default shared-memory
// carveout gave the default ones (135 KB on the H200, for their 2 blocks): they ask for the most shared memory.
template <typename Kernel>
void prefer_shared_memory(Kernel kernel) {
  GPT_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
}

template <int D, bool kDrop, int kRows = kDefaultFwdRows<D, kDrop>>
void forward_launch(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, const DropoutMask& drop,
                    cudaStream_t stream) {
  using Cfg = FwdCfg<D, kDrop, kRows>;
  constexpr size_t smem = Cfg::kBytes;
  const auto kernel = [] {
    if constexpr (kRows == kDefaultFwdRows<D, kDrop>) {
      return attention_forward_mma_kernel<D, kDrop>;
    } else {
      static_assert(kRows == 16 && D <= 64 && !kDrop);
      return attention_forward_mma16_kernel<D>;
    }
  }();
  set_smem(kernel, smem);
  if constexpr (kRows != kDefaultFwdRows<D, kDrop>) prefer_shared_memory(kernel);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(D));
  kernel<<<grid, kThreads, smem, stream>>>(out, lse, qkv, T, C, NH, scale_log2, drop, keep_scale(drop));
  GPT_CUDA_CHECK_LAUNCH();
}

// The forward at D <= 64 without dropout takes 16 query rows per warp, 64 per block, unless GPT_ATTENTION_FWD_ROWS=32
// (read at each launch) asks for the 32 and 128 of the other cases. On an H200 the 32-row kernel ran at 12% occupancy
// (8 warps per SM, held by registers and shared memory) with no warp eligible in 54% of cycles; 16 rows allow 4 blocks
// (16 warps) at the cost of twice the K and V fragment loads per product. Measured there at GPT-2 124M's shape
// (gpu_vs_pytorch.sh, with the lean backward below): 470,630 tokens/s against 458,177 with both off. The same products
// and sums in the same order; a row's tiles may take the masked copy of the softmax where 32 rows took the unmasked
// one (or back), which may differ in the last bit of P before its bf16 rounding.
bool forward_rows16() { return !env_is("GPT_ATTENTION_FWD_ROWS", "32"); }

template <int D>
void forward_impl(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, const DropoutMask& drop,
                  cudaStream_t stream) {
  if (drop.active()) {
    forward_launch<D, true>(out, lse, qkv, B, T, C, NH, drop, stream);
    return;
  }
  if constexpr (D <= 64) {
    if (forward_rows16()) {
      forward_launch<D, false, 16>(out, lse, qkv, B, T, C, NH, drop, stream);
      return;
    }
  }
  forward_launch<D, false>(out, lse, qkv, B, T, C, NH, drop, stream);
}

// The backward at D <= 64 without dropout runs its lean kernels, 3 blocks (12 warps) per SM, unless
// GPT_ATTENTION_BWD_BLOCKS=2 (read at each launch) asks for the 2 of the other cases. On an H200 both 2-block
// backward kernels ran at 12% occupancy with no warp eligible in 61% of cycles. The lean dK/dV kernel streams 32-query
// tiles and reads K and V from shared memory per tile (as at D = 128); the lean dQ kernel is the same code under a
// tighter register bound. Measured with the 16-row forward above; the same products and sums in the same order.
bool backward_blocks3() { return !env_is("GPT_ATTENTION_BWD_BLOCKS", "2"); }

// GPT_ATTENTION_DQ=recompute (read at each launch): the lean backward's dQ kernel recomputes S, P and dP from Q, K,
// V and dO even where the scratch keeps dS^T (attention_backward_q_ds_kernel), as the other configurations always do.
bool dq_from_kept_ds() { return !env_is("GPT_ATTENTION_DQ", "recompute"); }

// ds (lean kernels only; null: none kept): the dK/dV kernel writes dS^T there and the dQ kernel reads it.
template <int D, bool kLean>
void backward_launch(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec, int B, int T,
                     int C, int NH, const DropoutMask& drop, bf16* ds, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const float keep = keep_scale(drop);
  if constexpr (kLean) {
    if (ds != nullptr) {
      const int64_t ds_ld = cuda_workspace::attention_ds_stride(T);
      {
        using Cfg = BwdKvCfg<D, true>;
        constexpr size_t smem = Cfg::kBytes;
        const auto kernel = attention_backward_kv_ds_kernel<D>;
        set_smem(kernel, smem);
        prefer_shared_memory(kernel);
        const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BK)), static_cast<unsigned>(B * NH));
        kernel<<<grid, kThreads, smem, stream>>>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep, ds,
                                                 ds_ld);
        GPT_CUDA_CHECK_LAUNCH();
      }
      using Cfg = BwdQDsCfg<D>;
      constexpr size_t smem = Cfg::kBytes;
      const auto kernel = attention_backward_q_ds_kernel<D>;
      set_smem(kernel, smem);
      const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
      kernel<<<grid, kThreads, smem, stream>>>(dqkv, qkv, ds, ds_ld, T, C, NH, scale);
      GPT_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  {
    using Cfg = BwdKvCfg<D, kLean>;
    constexpr size_t smem = Cfg::kBytes;
    const auto kernel = [&] {
      if constexpr (kLean) {
        return attention_backward_kv_mma3_kernel<D>;
      } else {
        return drop.active() ? attention_backward_kv_mma_kernel<D, true> : attention_backward_kv_mma_kernel<D, false>;
      }
    }();
    set_smem(kernel, smem);
    if constexpr (kLean) prefer_shared_memory(kernel);
    const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BK)), static_cast<unsigned>(B * NH));
    kernel<<<grid, kThreads, smem, stream>>>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep);
    GPT_CUDA_CHECK_LAUNCH();
  }
  {
    using Cfg = BwdQCfg<D>;
    constexpr size_t smem = Cfg::kBytes;
    const auto kernel = [&] {
      if constexpr (kLean) {
        return attention_backward_q_mma3_kernel<D>;
      } else {
        return drop.active() ? attention_backward_q_mma_kernel<D, true> : attention_backward_q_mma_kernel<D, false>;
      }
    }();
    set_smem(kernel, smem);
    if constexpr (kLean) prefer_shared_memory(kernel);
    const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
    kernel<<<grid, kThreads, smem, stream>>>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep);
    GPT_CUDA_CHECK_LAUNCH();
  }
}

template <int D>
void backward_impl(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec, int B, int T,
                   int C, int NH, const DropoutMask& drop, bf16* ds, cudaStream_t stream) {
  if constexpr (D <= 64) {
    if (!drop.active() && backward_blocks3()) {
      backward_launch<D, true>(dqkv, dob, qkv, lse, dvec, B, T, C, NH, drop, dq_from_kept_ds() ? ds : nullptr, stream);
      return;
    }
  }
  backward_launch<D, false>(dqkv, dob, qkv, lse, dvec, B, T, C, NH, drop, nullptr, stream);
}

}  // namespace

bool attention_mma_supported(int C, int NH) { return attention_tc_supported(C, NH); }  // the same head sizes

size_t attention_mma_smem_bytes(int C, int NH) {
  GPT_CHECK(attention_mma_supported(C, NH));
  size_t bytes = 0;
  with_head_size(C / NH, [&](auto d) {
    constexpr int D = decltype(d)::value;
    bytes = std::max({FwdCfg<D, false>::kBytes, FwdCfg<D, true>::kBytes, BwdKvCfg<D>::kBytes, BwdQCfg<D>::kBytes,
                      BwdQDsCfg<D>::kBytes});
  });
  return bytes;
}

void attention_forward_mma(TensorPtr out, float* lse, ConstTensorPtr qkv, int B, int T, int C, int NH,
                           const DropoutMask& drop, cudaStream_t stream) {
  const int hs = check_shape(B, T, C, NH);
  GPT_CHECK(out.is_bf16() && qkv.is_bf16());
  if (B == 0 || T == 0) return;
  GPT_CHECK(aligned16(out.data) && aligned16(qkv.data));  // cp.async and 16-byte stores
  with_head_size(hs, [&](auto d) {
    forward_impl<decltype(d)::value>(out.as_bf16(), lse, qkv.as_bf16(), B, T, C, NH, drop, stream);
  });
}

size_t attention_backward_mma_scratch_bytes(int B, int T, int C, int NH, bool dropout) {
  return cuda_workspace::attention_backward_mma(B, T, C, NH, dropout);  // D (dO comes in bf16), dS^T
}

void attention_backward_mma(TensorPtr dqkv, const bf16* dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* lse,
                            int B, int T, int C, int NH, const DropoutMask& drop, void* scratch, cudaStream_t stream) {
  const int hs = check_shape(B, T, C, NH);
  GPT_CHECK(dqkv.is_bf16() && qkv.is_bf16() && out.is_bf16());
  if (B == 0 || T == 0) return;
  GPT_CHECK(aligned16(dqkv.data) && aligned16(dout) && aligned16(qkv.data) && aligned16(out.data) &&
            aligned16(scratch));
  float* dvec = static_cast<float*>(scratch);
  {
    const int64_t rows = static_cast<int64_t>(B) * T * NH;
    constexpr int kPrepThreads = 256;
    GPT_CHECK(hs % 4 == 0 && kWarp % (hs / 4) == 0);  // whole rows per warp (check_shape: hs 32, 64 or 128)
    const dim3 grid(static_cast<unsigned>(ceil_div(rows, kPrepThreads / kWarp * (kWarp / (hs / 4)))));
    attention_prep_mma_kernel<<<grid, kPrepThreads, 0, stream>>>(dvec, dout, out.as_bf16(), rows, T, C, NH, hs);
    GPT_CUDA_CHECK_LAUNCH();
  }
  // dS^T where the scratch keeps it (attention_backward_mma_scratch_bytes), after D.
  bf16* ds = cuda_workspace::attention_ds_kept(B, T, C, NH, drop.active())
                 ? reinterpret_cast<bf16*>(static_cast<char*>(scratch) +
                                           cuda_workspace::align_up(cuda_workspace::attention_backward(B, T, NH)))
                 : nullptr;
  with_head_size(hs, [&](auto d) {
    backward_impl<decltype(d)::value>(dqkv.as_bf16(), dout, qkv.as_bf16(), lse, dvec, B, T, C, NH, drop, ds, stream);
  });
}

}  // namespace gpt::cuda
