// Fused causal multi-head attention on the tensor cores: bf16 WMMA 16x16x16 products with fp32 accumulation,
// the same math, arguments, lse state, dropout mask and deterministic three-kernel backward as attention.cu
// (read that file first; this one only says what differs).
//  - Every block has 4 warps; each warp owns 16 rows of the block's 64-row tile (query rows in the forward and
//    the dQ kernel, key rows in the dK/dV kernel) and the fragments of its products, so no warp ever sums into
//    another's rows: no atomics, and every sum runs in a fixed order.
//  - Tiles are read from global memory as fp32 float4 (coalesced) and rounded (nearest even) to bf16 into shared
//    rows padded by 8 elements (16 bytes), which keeps WMMA loads free of bank conflicts.
//  - The operand the warp reuses most (Q in the forward, K and V in dK/dV, Q and dO in dQ) stays in registers as
//    matrix_a fragments (for head size 128 only in the forward: the accumulators need the registers).
//  - The fragments' element layout is opaque, so kernels touch fragments only through load/store/fill/mma and
//    through element-wise x[i] operations whose meaning does not depend on the layout: each warp loads an
//    "index fragment" whose element i holds 16 r + c for the position (r, c) it maps to in every accumulator
//    fragment (all accumulators of one type share the layout), which gives row-wise scaling (the online
//    softmax's rescale of O) and per-element masks without knowing the layout.
//  - Forward: S = Q K^T goes to a per-warp fp32 shared tile; two lanes per query row take the row's max and
//    sum (one shuffle), write P Z rounded to bf16 into a per-warp tile, and O += (P Z) V runs on the tensor cores.
//    The normaliser l sums the fp32 (undropped, unrounded) P, as in attention.cu.
//  - Backward: S and dP = dO V^T are recomputed in fragments; P = exp(scale S - lse) and
//    dS = P (Z dP - Dv) are formed element-wise and written as bf16 to per-warp tiles, then
//    dV += (P Z)^T dO, dK += dS^T Q (key tiles) and dQ += dS K (query tiles) on the tensor cores.
//  - Tiles of 16 x 16 that lie wholly above the diagonal are skipped (their P and dS are zero).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {

namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
using AFrag = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using BRowFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using BColFrag = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kRows = 16;  // rows per warp (one fragment tall)

constexpr size_t align128(size_t x) { return (x + 127) / 128 * 128; }

// Shared layouts (byte offsets; every region 128-byte aligned: WMMA pointers must be 32-byte aligned).
// bf16 tiles have row stride D + 8 elements; per-warp fp32 tiles D + 4 or BK + 4 floats (a multiple of 4, as
// store_matrix_sync wants); per-warp bf16 score tiles BK + 8.
template <int D>
struct FwdCfg {
  static constexpr int BQ = 64, BK = 64;
  static constexpr int LDK = D + 8, LDS = (BK > D ? BK : D) + 4, LDP = BK + 8;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = align128(kK + sizeof(bf16) * BK * LDK);
  static constexpr size_t kS = align128(kV + sizeof(bf16) * BK * LDK);  // per-warp S / O tiles; Q staged here first
  static constexpr size_t kP = align128(kS + sizeof(float) * kWarps * kRows * LDS);
  static constexpr size_t kStat = align128(kP + sizeof(bf16) * kWarps * kRows * LDP);  // per warp: alpha[16], 1/l[16]
  static constexpr size_t kBytes = align128(kStat + sizeof(float) * kWarps * 2 * kRows);
  static_assert(BQ == BK && BQ == kWarps * kRows);
  static_assert(sizeof(bf16) * BQ * LDK <= sizeof(float) * kWarps * kRows * LDS);  // Q fits the S tiles
};

template <int D>
struct BwdKvCfg {
  static constexpr int BK = 64, BQ = D <= 64 ? 64 : 32;
  static constexpr bool kKeep = D <= 64;  // K, V fragments in registers
  static constexpr int LDK = D + 8, LDB = BQ + 8;
  static constexpr size_t kK = 0;
  static constexpr size_t kV = align128(kK + sizeof(bf16) * BK * LDK);
  static constexpr size_t kQ = align128(kV + sizeof(bf16) * BK * LDK);
  static constexpr size_t kDo = align128(kQ + sizeof(bf16) * BQ * LDK);
  static constexpr size_t kLse = align128(kDo + sizeof(bf16) * BQ * LDK);
  static constexpr size_t kDv = align128(kLse + sizeof(float) * BQ);
  static constexpr size_t kP = align128(kDv + sizeof(float) * BQ);                   // per-warp (P Z)^T tiles
  static constexpr size_t kDs = align128(kP + sizeof(bf16) * kWarps * kRows * LDB);  // per-warp dS^T tiles
  static constexpr size_t kBytes = align128(kDs + sizeof(bf16) * kWarps * kRows * LDB);
  static_assert(BK == kWarps * kRows && BK % BQ == 0);
  static_assert(sizeof(float) * kWarps * kRows * (D + 4) <= kBytes);  // the epilogue's fp32 tiles
  static_assert(sizeof(bf16) * kRows * LDB >= sizeof(float) * 256);   // the index fragment's staging
};

template <int D>
struct BwdQCfg {
  static constexpr int BQ = 64, BK = 64;
  static constexpr bool kKeep = D <= 64;  // Q, dO fragments in registers
  static constexpr int LDK = D + 8, LDB = BK + 8;
  static constexpr size_t kQ = 0;
  static constexpr size_t kDo = align128(kQ + sizeof(bf16) * BQ * LDK);
  static constexpr size_t kK = align128(kDo + sizeof(bf16) * BQ * LDK);
  static constexpr size_t kV = align128(kK + sizeof(bf16) * BK * LDK);
  static constexpr size_t kLse = align128(kV + sizeof(bf16) * BK * LDK);
  static constexpr size_t kDv = align128(kLse + sizeof(float) * BQ);
  static constexpr size_t kDs = align128(kDv + sizeof(float) * BQ);  // per-warp dS tiles
  static constexpr size_t kBytes = align128(kDs + sizeof(bf16) * kWarps * kRows * LDB);
  static_assert(BQ == BK && BQ == kWarps * kRows);
  static_assert(sizeof(float) * kWarps * kRows * (D + 4) <= kBytes);
  static_assert(sizeof(bf16) * kRows * LDB >= sizeof(float) * 256);
};

// Four floats rounded to bf16 (nearest even) into dst[0..3] (8-byte aligned).
__device__ inline void store_bf16x4(bf16* dst, float4 x) {
  union {
    __nv_bfloat162 h[2];
    uint2 u;
  } pk;
  pk.h[0] = __floats2bfloat162_rn(x.x, x.y);
  pk.h[1] = __floats2bfloat162_rn(x.z, x.w);
  *reinterpret_cast<uint2*>(dst) = pk.u;
}

// Rows [row0, row0 + ROWS) x channels [0, D) of a global fp32 matrix with row stride ld (floats) into a bf16
// shared tile of stride LD; rows past `rows` are zero. Consecutive threads read consecutive float4s of a row.
template <int ROWS, int D, int LD>
__device__ inline void load_tile_bf16(bf16* dst, const float* src, int64_t ld, int row0, int rows) {
  constexpr int kVecs = D / 4;
  for (int i = threadIdx.x; i < ROWS * kVecs; i += kThreads) {
    const int r = i / kVecs, c = (i % kVecs) * 4, row = row0 + r;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < rows) x = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(row) * ld + c);
    store_bf16x4(dst + r * LD + c, x);
  }
}

// The same from a bf16 matrix (qkv stored in bf16 under bf16 compute): four elements (8 bytes) at a time, as they
// are; what the fp32 loader gives for the widened values, bit for bit.
template <int ROWS, int D, int LD>
__device__ inline void load_tile_bf16(bf16* dst, const gpt::bf16* src, int64_t ld, int row0, int rows) {
  constexpr int kVecs = D / 4;
  for (int i = threadIdx.x; i < ROWS * kVecs; i += kThreads) {
    const int r = i / kVecs, c = (i % kVecs) * 4, row = row0 + r;
    uint2 x{0u, 0u};
    if (row < rows) x = *reinterpret_cast<const uint2*>(src + static_cast<int64_t>(row) * ld + c);
    *reinterpret_cast<uint2*>(dst + r * LD + c) = x;
  }
}

// src[row0 + r] for r < ROWS (0 past `rows`).
template <int ROWS>
__device__ inline void load_rows(float* dst, const float* src, int row0, int rows) {
  for (int r = threadIdx.x; r < ROWS; r += kThreads) dst[r] = row0 + r < rows ? src[row0 + r] : 0.0f;
}

// A warp's fp32 tile of kRows rows x D channels (shared, stride LD) to global rows row0.. (stride ld), those
// below `rows` only; float4 stores (four bf16 in one 8-byte store for a bf16 dst, rounded to nearest even),
// consecutive lanes on consecutive channels.
template <int D, int LD>
__device__ inline void store_rows(float* dst, int64_t ld, const float* tile, int row0, int rows, int lane) {
  constexpr int kVecs = D / 4;
  for (int i = lane; i < kRows * kVecs; i += kWarp) {
    const int r = i / kVecs, c = (i % kVecs) * 4;
    if (row0 + r < rows) {
      *reinterpret_cast<float4*>(dst + static_cast<int64_t>(row0 + r) * ld + c) =
          *reinterpret_cast<const float4*>(tile + r * LD + c);
    }
  }
}
template <int D, int LD>
__device__ inline void store_rows(gpt::bf16* dst, int64_t ld, const float* tile, int row0, int rows, int lane) {
  constexpr int kVecs = D / 4;
  for (int i = lane; i < kRows * kVecs; i += kWarp) {
    const int r = i / kVecs, c = (i % kVecs) * 4;
    if (row0 + r < rows) {
      const float4 x = *reinterpret_cast<const float4*>(tile + r * LD + c);
      const float v[4] = {x.x, x.y, x.z, x.w};
      store4_bf16(dst + static_cast<int64_t>(row0 + r) * ld + c, v, true, 4);
    }
  }
}

// The index fragment: element i holds 16 r + c, (r, c) being where element i of any accumulator fragment sits.
// `staging` is 256 floats of this warp's shared memory (32-byte aligned), free before and after.
__device__ inline void make_index_frag(AccFrag& idx, float* staging, int lane) {
  for (int i = lane; i < 256; i += kWarp) staging[i] = static_cast<float>(i);
  __syncwarp();
  wmma::load_matrix_sync(idx, staging, 16, wmma::mem_row_major);
  __syncwarp();
}

// The backward's two score products for one 16-column block nb: s = A1 B1^T and dp = A2 B2^T over the head size
// (KD fragments of 16), A's 16 rows this warp's, B's the block's 16 rows of b1, b2 (row stride LDK). With kKeep
// A1 and A2 are the fragments a1k, a2k kept in registers, else they are read from a1, a2 (this warp's rows).
// The dK/dV kernel takes A = K, V and B = Q, dO (S^T, dP^T); the dQ kernel A = Q, dO and B = K, V.
template <int KD, int LDK, bool kKeep, int N>
__device__ inline void score_products(AccFrag& s, AccFrag& dp, const AFrag (&a1k)[N], const AFrag (&a2k)[N],
                                      const bf16* a1, const bf16* a2, const bf16* b1, const bf16* b2) {
  wmma::fill_fragment(s, 0.0f);
  wmma::fill_fragment(dp, 0.0f);
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    BColFrag b1f, b2f;  // B1^T, B2^T
    wmma::load_matrix_sync(b1f, b1 + kk * 16, LDK);
    wmma::load_matrix_sync(b2f, b2 + kk * 16, LDK);
    if constexpr (kKeep) {
      wmma::mma_sync(s, a1k[kk], b1f, s);
      wmma::mma_sync(dp, a2k[kk], b2f, dp);
    } else {
      AFrag a;
      wmma::load_matrix_sync(a, a1 + kk * 16, LDK);
      wmma::mma_sync(s, a, b1f, s);
      wmma::load_matrix_sync(a, a2 + kk * 16, LDK);
      wmma::mma_sync(dp, a, b2f, dp);
    }
  }
}

template <int D, typename In, typename Out>
__global__ void __launch_bounds__(kThreads)
    attention_forward_tc_kernel(Out* out, float* lse, const In* qkv, int T, int C, int NH, float scale,
                                DropoutMask drop, float keep, int sections) {
  using Cfg = FwdCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LDK = Cfg::LDK, LDS = Cfg::LDS, LDP = Cfg::LDP;
  constexpr int KD = D / 16, NB = BK / 16, kHalf = BK / 2;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sk = reinterpret_cast<bf16*>(smem_raw + Cfg::kK);
  bf16* sv = reinterpret_cast<bf16*>(smem_raw + Cfg::kV);
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kS);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* ss = reinterpret_cast<float*>(smem_raw + Cfg::kS) + warp * kRows * LDS;
  bf16* sp = reinterpret_cast<bf16*>(smem_raw + Cfg::kP) + warp * kRows * LDP;
  float* sstat = reinterpret_cast<float*>(smem_raw + Cfg::kStat) + warp * 2 * kRows;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const In* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const In* k = q + C;
  const In* v = q + 2 * C;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  AccFrag idx;
  make_index_frag(idx, ss, lane);
  __syncthreads();  // every warp holds its index fragment before Q overwrites the S tiles
  load_tile_bf16<BQ, D, LDK>(sq, q, C3, q0, T);
  __syncthreads();
  const int qw = q0 + warp * kRows;  // this warp's first query row
  const bool active = qw < T;        // warp-uniform
  AFrag qa[KD];
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) wmma::load_matrix_sync(qa[kk], sq + warp * kRows * LDK + kk * 16, LDK);
  AccFrag o[KD];
#pragma unroll
  for (int d = 0; d < KD; ++d) wmma::fill_fragment(o[d], 0.0f);

  // Two lanes per row: lane 2r + hf takes row r, columns hf*kHalf + ((j + rot) mod kHalf) at step j. LDS is
  // 4 mod 32 floats, so the rotation puts the 32 lanes' reads of one step in 32 different banks.
  const int r = lane >> 1, hf = lane & 1, rot = (r >> 3) + 2 * hf, t = qw + r;
  const uint64_t row_first = first + static_cast<uint64_t>(t) * T;  // mask index of (t, 0)
  float m = -INFINITY, l = 0.0f;
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile
  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // everyone is done with the previous K, V (and the Q staging)
    load_tile_bf16<BK, D, LDK>(sk, k, C3, k0, T);
    load_tile_bf16<BK, D, LDK>(sv, v, C3, k0, T);
    __syncthreads();
    if (!active) continue;
    // Key blocks nb < nb_hi hold a key <= the warp's last row (qw >= k0: the tiles are square and aligned).
    const int nb_hi = min(NB, (qw - k0) / 16 + 1);
    AccFrag s[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
      if (nb >= nb_hi) continue;
      wmma::fill_fragment(s[nb], 0.0f);
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        BColFrag kb;  // K^T
        wmma::load_matrix_sync(kb, sk + nb * 16 * LDK + kk * 16, LDK);
        wmma::mma_sync(s[nb], qa[kk], kb, s[nb]);
      }
      wmma::store_matrix_sync(ss + nb * 16, s[nb], LDS, wmma::mem_row_major);
    }
    __syncwarp();
    const int ncols = nb_hi * 16;
    float sv_row[kHalf];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      const int c = hf * kHalf + ((j + rot) & (kHalf - 1));
      sv_row[j] = c < ncols && k0 + c <= t ? ss[r * LDS + c] * scale : -INFINITY;
      mx = fmaxf(mx, sv_row[j]);
    }
    // Finite: key k0 <= qw <= t is always visible. Both lanes of a row get the bitwise same max and sum.
    const float m_new = fmaxf(m, fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1)));
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kHalf; ++j) {
      const int c = hf * kHalf + ((j + rot) & (kHalf - 1)), t2 = k0 + c;
      const float p = expf(sv_row[j] - m_new);  // 0 where masked
      sum += p;
      if (c < ncols) {
        // Padded rows (t >= T) are never written: skip their RNG draws.
        const float z = drop.active() && t2 <= t && t < T ? dropout_factor(drop, keep, row_first + t2) : 1.0f;
        sp[r * LDP + c] = __float2bfloat16(p * z);
      }
    }
    l = l * alpha + (sum + __shfl_xor_sync(0xffffffffu, sum, 1));  // normaliser of the undropped, unrounded P
    m = m_new;
    if (hf == 0) sstat[r] = alpha;
    __syncwarp();
#pragma unroll
    for (int d = 0; d < KD; ++d) {
#pragma unroll
      for (int i = 0; i < o[d].num_elements; ++i) o[d].x[i] *= sstat[static_cast<int>(idx.x[i]) >> 4];
    }
#pragma unroll
    for (int kk = 0; kk < NB; ++kk) {
      if (kk >= nb_hi) continue;
      AFrag pa;
      wmma::load_matrix_sync(pa, sp + kk * 16, LDP);
#pragma unroll
      for (int d = 0; d < KD; ++d) {
        BRowFrag vb;
        wmma::load_matrix_sync(vb, sv + kk * 16 * LDK + d * 16, LDK);
        wmma::mma_sync(o[d], pa, vb, o[d]);
      }
    }
  }

  if (active) {
    if (hf == 0) {
      sstat[kRows + r] = 1.0f / l;
      if (t < T) lse[static_cast<int64_t>(bh) * T + t] = m + logf(l);
    }
    __syncwarp();  // also: every lane is done reading the last S tile
#pragma unroll
    for (int d = 0; d < KD; ++d) {
#pragma unroll
      for (int i = 0; i < o[d].num_elements; ++i) o[d].x[i] *= sstat[kRows + (static_cast<int>(idx.x[i]) >> 4)];
      wmma::store_matrix_sync(ss + d * 16, o[d], LDS, wmma::mem_row_major);
    }
    __syncwarp();
    store_rows<D, LDS>(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D, C, ss, qw, T, lane);
  }
}

// dK, dV for one key tile of one (b, h); warp w owns keys k0 + 16w.. and sums over the query tiles in ascending
// order. Works on transposed scores: S^T = K Q^T (keys x queries).
template <int D, typename In, typename G>
__global__ void __launch_bounds__(kThreads)
    attention_backward_kv_tc_kernel(In* dqkv, const G* dout, const In* qkv, const float* lse, const float* dvec, int T,
                                    int C, int NH, float scale, DropoutMask drop, float keep, int sections) {
  using Cfg = BwdKvCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LDK = Cfg::LDK, LDB = Cfg::LDB;
  constexpr int KD = D / 16, NBQ = BQ / 16;
  constexpr bool kKeep = Cfg::kKeep;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sk = reinterpret_cast<bf16*>(smem_raw + Cfg::kK);
  bf16* sv = reinterpret_cast<bf16*>(smem_raw + Cfg::kV);
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kQ);
  bf16* sdo = reinterpret_cast<bf16*>(smem_raw + Cfg::kDo);
  float* slse = reinterpret_cast<float*>(smem_raw + Cfg::kLse);
  float* sdv = reinterpret_cast<float*>(smem_raw + Cfg::kDv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  bf16* sp = reinterpret_cast<bf16*>(smem_raw + Cfg::kP) + warp * kRows * LDB;
  bf16* sds = reinterpret_cast<bf16*>(smem_raw + Cfg::kDs) + warp * kRows * LDB;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int k0 = tile.rank * BK;  // rank 0: the first key tile, seen by the most queries
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const In* q = qkv + qkv_off;
  const In* k = q + C;
  const In* v = q + 2 * C;
  const G* dO = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* dvec_bh = dvec + static_cast<int64_t>(bh) * T;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  AccFrag idx;
  make_index_frag(idx, reinterpret_cast<float*>(sp), lane);
  load_tile_bf16<BK, D, LDK>(sk, k, C3, k0, T);
  load_tile_bf16<BK, D, LDK>(sv, v, C3, k0, T);
  __syncthreads();
  const int kw = k0 + warp * kRows;  // this warp's first key row
  const bool active = kw < T;        // warp-uniform
  AFrag ka[kKeep ? KD : 1], va[kKeep ? KD : 1];
  if constexpr (kKeep) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      wmma::load_matrix_sync(ka[kk], sk + warp * kRows * LDK + kk * 16, LDK);
      wmma::load_matrix_sync(va[kk], sv + warp * kRows * LDK + kk * 16, LDK);
    }
  }
  AccFrag dk[KD], dv[KD];
#pragma unroll
  for (int d = 0; d < KD; ++d) {
    wmma::fill_fragment(dk[d], 0.0f);
    wmma::fill_fragment(dv[d], 0.0f);
  }

  const int num_qt = (T + BQ - 1) / BQ;
  for (int qt = k0 / BQ; qt < num_qt; ++qt) {  // from the tile holding query k0 (the diagonal) down
    const int q0 = qt * BQ;
    __syncthreads();  // everyone is done with the previous Q, dO, lse, Dv tiles
    load_tile_bf16<BQ, D, LDK>(sq, q, C3, q0, T);
    load_tile_bf16<BQ, D, LDK>(sdo, dO, C, q0, T);
    load_rows<BQ>(slse, lse_bh, q0, T);
    load_rows<BQ>(sdv, dvec_bh, q0, T);
    __syncthreads();
    if (!active) continue;
    // Query blocks nb < nb_lo end before the warp's first key: all masked.
    const int nb_lo = kw > q0 ? (kw - q0) / 16 : 0;
    if (nb_lo >= NBQ) continue;
    AccFrag s[NBQ], dp[NBQ];
#pragma unroll
    for (int nb = 0; nb < NBQ; ++nb) {
      if (nb < nb_lo) continue;
      score_products<KD, LDK, kKeep>(s[nb], dp[nb], ka, va, sk + warp * kRows * LDK, sv + warp * kRows * LDK,
                                     sq + nb * 16 * LDK, sdo + nb * 16 * LDK);
#pragma unroll
      for (int i = 0; i < s[nb].num_elements; ++i) {
        const int rc = static_cast<int>(idx.x[i]), r = rc >> 4, c = nb * 16 + (rc & 15);
        const int t = q0 + c, t2 = kw + r;
        const bool visible = t < T && t2 <= t;
        const float p = visible ? expf(s[nb].x[i] * scale - slse[c]) : 0.0f;
        const float z =
            visible && drop.active() ? dropout_factor(drop, keep, first + static_cast<uint64_t>(t) * T + t2) : 1.0f;
        sp[r * LDB + c] = __float2bfloat16(p * z);
        sds[r * LDB + c] = __float2bfloat16(p * (z * dp[nb].x[i] - sdv[c]));  // not yet times scale
      }
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < NBQ; ++kk) {
      if (kk < nb_lo) continue;
      AFrag pa, dsa;
      wmma::load_matrix_sync(pa, sp + kk * 16, LDB);
      wmma::load_matrix_sync(dsa, sds + kk * 16, LDB);
#pragma unroll
      for (int d = 0; d < KD; ++d) {
        BRowFrag ob, qb;
        wmma::load_matrix_sync(ob, sdo + kk * 16 * LDK + d * 16, LDK);
        wmma::mma_sync(dv[d], pa, ob, dv[d]);
        wmma::load_matrix_sync(qb, sq + kk * 16 * LDK + d * 16, LDK);
        wmma::mma_sync(dk[d], dsa, qb, dk[d]);
      }
    }
  }

  __syncthreads();  // all shared tiles are free: reuse them as per-warp fp32 output tiles
  constexpr int LDO = D + 4;
  float* so = reinterpret_cast<float*>(smem_raw) + warp * kRows * LDO;
  if (active) {
    In* dk_out = dqkv + qkv_off + C;
#pragma unroll
    for (int d = 0; d < KD; ++d) {
#pragma unroll
      for (int i = 0; i < dk[d].num_elements; ++i) dk[d].x[i] *= scale;
      wmma::store_matrix_sync(so + d * 16, dk[d], LDO, wmma::mem_row_major);
    }
    __syncwarp();
    store_rows<D, LDO>(dk_out, C3, so, kw, T, lane);
    __syncwarp();
#pragma unroll
    for (int d = 0; d < KD; ++d) wmma::store_matrix_sync(so + d * 16, dv[d], LDO, wmma::mem_row_major);
    __syncwarp();
    store_rows<D, LDO>(dk_out + C, C3, so, kw, T, lane);
  }
}

// dQ for one query tile of one (b, h); warp w owns queries q0 + 16w.. and sums over the key tiles in ascending
// order.
template <int D, typename In, typename G>
__global__ void __launch_bounds__(kThreads)
    attention_backward_q_tc_kernel(In* dqkv, const G* dout, const In* qkv, const float* lse, const float* dvec, int T,
                                   int C, int NH, float scale, DropoutMask drop, float keep, int sections) {
  using Cfg = BwdQCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LDK = Cfg::LDK, LDB = Cfg::LDB;
  constexpr int KD = D / 16, NBK = BK / 16;
  constexpr bool kKeep = Cfg::kKeep;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kQ);
  bf16* sdo = reinterpret_cast<bf16*>(smem_raw + Cfg::kDo);
  bf16* sk = reinterpret_cast<bf16*>(smem_raw + Cfg::kK);
  bf16* sv = reinterpret_cast<bf16*>(smem_raw + Cfg::kV);
  float* slse = reinterpret_cast<float*>(smem_raw + Cfg::kLse);
  float* sdv = reinterpret_cast<float*>(smem_raw + Cfg::kDv);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  bf16* sds = reinterpret_cast<bf16*>(smem_raw + Cfg::kDs) + warp * kRows * LDB;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const In* q = qkv + qkv_off;
  const In* k = q + C;
  const In* v = q + 2 * C;
  const G* dO = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * D;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  AccFrag idx;
  make_index_frag(idx, reinterpret_cast<float*>(sds), lane);
  load_tile_bf16<BQ, D, LDK>(sq, q, C3, q0, T);
  load_tile_bf16<BQ, D, LDK>(sdo, dO, C, q0, T);
  load_rows<BQ>(slse, lse + static_cast<int64_t>(bh) * T, q0, T);
  load_rows<BQ>(sdv, dvec + static_cast<int64_t>(bh) * T, q0, T);
  __syncthreads();
  const int qw = q0 + warp * kRows;  // this warp's first query row
  const bool active = qw < T;        // warp-uniform
  AFrag qa[kKeep ? KD : 1], doa[kKeep ? KD : 1];
  if constexpr (kKeep) {
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      wmma::load_matrix_sync(qa[kk], sq + warp * kRows * LDK + kk * 16, LDK);
      wmma::load_matrix_sync(doa[kk], sdo + warp * kRows * LDK + kk * 16, LDK);
    }
  }
  AccFrag dq[KD];
#pragma unroll
  for (int d = 0; d < KD; ++d) wmma::fill_fragment(dq[d], 0.0f);

  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile
  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // everyone is done with the previous K, V tiles
    load_tile_bf16<BK, D, LDK>(sk, k, C3, k0, T);
    load_tile_bf16<BK, D, LDK>(sv, v, C3, k0, T);
    __syncthreads();
    if (!active) continue;
    // Key blocks nb < nb_hi hold a key <= the warp's last row (qw >= k0: the tiles are square and aligned).
    const int nb_hi = min(NBK, (qw - k0) / 16 + 1);
    AccFrag s[NBK], dp[NBK];
#pragma unroll
    for (int nb = 0; nb < NBK; ++nb) {
      if (nb >= nb_hi) continue;
      score_products<KD, LDK, kKeep>(s[nb], dp[nb], qa, doa, sq + warp * kRows * LDK, sdo + warp * kRows * LDK,
                                     sk + nb * 16 * LDK, sv + nb * 16 * LDK);
#pragma unroll
      for (int i = 0; i < s[nb].num_elements; ++i) {
        const int rc = static_cast<int>(idx.x[i]), r = rc >> 4, c = nb * 16 + (rc & 15);
        const int rl = warp * kRows + r, t = qw + r, t2 = k0 + c;
        const bool visible = t < T && t2 <= t;
        const float p = visible ? expf(s[nb].x[i] * scale - slse[rl]) : 0.0f;
        const float z =
            visible && drop.active() ? dropout_factor(drop, keep, first + static_cast<uint64_t>(t) * T + t2) : 1.0f;
        sds[r * LDB + c] = __float2bfloat16(p * (z * dp[nb].x[i] - sdv[rl]));  // not yet times scale
      }
    }
    __syncwarp();
#pragma unroll
    for (int kk = 0; kk < NBK; ++kk) {
      if (kk >= nb_hi) continue;
      AFrag dsa;
      wmma::load_matrix_sync(dsa, sds + kk * 16, LDB);
#pragma unroll
      for (int d = 0; d < KD; ++d) {
        BRowFrag kb;
        wmma::load_matrix_sync(kb, sk + kk * 16 * LDK + d * 16, LDK);
        wmma::mma_sync(dq[d], dsa, kb, dq[d]);
      }
    }
  }

  __syncthreads();  // all shared tiles are free: reuse them as per-warp fp32 output tiles
  constexpr int LDO = D + 4;
  float* so = reinterpret_cast<float*>(smem_raw) + warp * kRows * LDO;
  if (active) {
#pragma unroll
    for (int d = 0; d < KD; ++d) {
#pragma unroll
      for (int i = 0; i < dq[d].num_elements; ++i) dq[d].x[i] *= scale;
      wmma::store_matrix_sync(so + d * 16, dq[d], LDO, wmma::mem_row_major);
    }
    __syncwarp();
    store_rows<D, LDO>(dqkv + qkv_off, C3, so, qw, T, lane);
  }
}

// Validates the shape; returns the head size.
int check_shape(int B, int T, int C, int NH) {
  GPT_CHECK(B >= 0 && T >= 0);
  GPT_CHECK(attention_tc_supported(C, NH));
  GPT_CHECK(static_cast<int64_t>(B) * NH <= 65535);  // gridDim.y
  return C / NH;
}

template <int D, typename In, typename Out>
void forward_impl(Out* out, float* lse, const In* qkv, int B, int T, int C, int NH, const DropoutMask& drop,
                  cudaStream_t stream) {
  using Cfg = FwdCfg<D>;
  constexpr size_t smem = Cfg::kBytes;
  const auto kernel = attention_forward_tc_kernel<D, In, Out>;
  set_smem(kernel, smem);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
  kernel<<<grid, kThreads, smem, stream>>>(out, lse, qkv, T, C, NH, 1.0f / std::sqrt(static_cast<float>(D)), drop,
                                           keep_scale(drop), attention_sections(B * NH, T, D, sizeof(In)));
  GPT_CUDA_CHECK_LAUNCH();
}

template <int D, typename In, typename G>
void backward_impl(In* dqkv, const G* dout, const In* qkv, const float* lse, const float* dvec, int B, int T, int C,
                   int NH, const DropoutMask& drop, cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float keep = keep_scale(drop);
  const int sections = attention_sections(B * NH, T, D, sizeof(In));
  {
    using Cfg = BwdKvCfg<D>;
    constexpr size_t smem = Cfg::kBytes;
    const auto kernel = attention_backward_kv_tc_kernel<D, In, G>;
    set_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BK)), static_cast<unsigned>(B * NH));
    kernel<<<grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, dvec, T, C, NH, scale, drop, keep, sections);
    GPT_CUDA_CHECK_LAUNCH();
  }
  {
    using Cfg = BwdQCfg<D>;
    constexpr size_t smem = Cfg::kBytes;
    const auto kernel = attention_backward_q_tc_kernel<D, In, G>;
    set_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
    kernel<<<grid, kThreads, smem, stream>>>(dqkv, dout, qkv, lse, dvec, T, C, NH, scale, drop, keep, sections);
    GPT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

bool attention_tc_supported(int C, int NH) {
  if (NH <= 0 || C <= 0 || C % NH != 0) return false;
  const int hs = C / NH;
  return hs == 32 || hs == 64 || hs == 128;
}

size_t attention_tc_smem_bytes(int C, int NH) {
  GPT_CHECK(attention_tc_supported(C, NH));
  size_t bytes = 0;
  with_head_size(C / NH, [&](auto d) {
    constexpr int D = decltype(d)::value;
    bytes = std::max({FwdCfg<D>::kBytes, BwdKvCfg<D>::kBytes, BwdQCfg<D>::kBytes});
  });
  return bytes;
}

void attention_forward_tc(TensorPtr out, float* lse, ConstTensorPtr qkv, int B, int T, int C, int NH,
                          const DropoutMask& drop, cudaStream_t stream) {
  const int hs = check_shape(B, T, C, NH);
  GPT_CHECK(out.dtype == qkv.dtype);
  if (B == 0 || T == 0) return;
  GPT_CHECK(aligned16(out.data) && aligned16(qkv.data));  // float4 access (8-byte for bf16)
  with_dtype(qkv, [&](auto* q) {
    auto* o = static_cast<element_t<decltype(q)>*>(out.data);  // out has qkv's dtype
    with_head_size(hs, [&](auto d) { forward_impl<decltype(d)::value>(o, lse, q, B, T, C, NH, drop, stream); });
  });
}

void attention_backward_tc(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out,
                           const float* lse, int B, int T, int C, int NH, const DropoutMask& drop, void* scratch,
                           cudaStream_t stream) {
  const int hs = check_shape(B, T, C, NH);
  GPT_CHECK(dqkv.dtype == qkv.dtype && out.dtype == qkv.dtype);
  if (B == 0 || T == 0) return;
  GPT_CHECK(aligned16(dqkv.data) && aligned16(dout.data) && aligned16(qkv.data));  // float4 access
  float* dvec = static_cast<float*>(scratch);
  // attention.cu's, with O as bf16 (rounded when stored in fp32), as FlashAttention's bf16 O.
  attention_row_dot(dvec, dout, out, /*round_out=*/true, B, T, C, NH, stream);
  with_dtype(qkv, [&](auto* q) {
    auto* dq = static_cast<element_t<decltype(q)>*>(dqkv.data);  // dqkv has qkv's dtype
    with_dtype(dout, [&](auto* dy) {
      with_head_size(
          hs, [&](auto d) { backward_impl<decltype(d)::value>(dq, dy, q, lse, dvec, B, T, C, NH, drop, stream); });
    });
  });
}

}  // namespace gpt::cuda
