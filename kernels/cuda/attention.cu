// Fused causal multi-head attention in fp32, the GPU twin of kernels/cpu/attention.cc, FlashAttention-2 style:
// no T x T matrix ever reaches global memory.
//  Forward: one block per (query tile, batch*head). It keeps its Q tile in shared memory, walks the K/V tiles
//  up to the diagonal and keeps a running max m, sum l and output O per query row (online softmax):
//    S = scale Q K^T,  m' = max(m, rowmax S),  P = exp(S - m'),  l = l e^(m-m') + rowsum P,
//    O = O e^(m-m') + (P Z) V,
//  then writes O / l and lse = m + log l (saved for backward instead of P). The normaliser is of the undropped
//  P; Z is the dropout factor (0 or 1/(1-p), 1 when inactive).
//  Backward, three kernels, no atomics, every sum in a fixed order:
//   1. Dv_t = dO_t . O_t per query row (= sum_t2 P dP, the softmax backward's row term).
//   2. One block per key tile, looping over the query tiles from the diagonal down: recompute
//      P = exp(scale q.k - lse), then dV += (P Z)^T dO and dK += scale dS^T Q with dS = P (Z dO.v - Dv).
//   3. One block per query tile, looping over the key tiles up to the diagonal: dQ += scale dS K.
// Dropout element (b, h, t, t2) is drop.rng.uniform(drop.base + ((b*NH + h)*T + t)*T + t2) < p, as on the CPU.
// Tiles are zero-padded to a head size D in {32, 64, 128}. Threads form a TY x 16 grid; each owns a strided
// micro-tile (rows ty + TY*i, columns tx + 16*j), so a row's 16 threads are one half warp (row reductions are
// shuffles) and, with shared rows padded to odd strides, every shared-memory read is conflict-free.
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {

namespace {

constexpr int kTx = 16;  // threads along a tile's columns: a half warp

// One kernel's tiling: BQ query rows, BK key rows, TY x kTx threads.
template <int BQ_, int BK_, int TY_>
struct Tiles {
  static constexpr int BQ = BQ_, BK = BK_, TY = TY_, kThreads = TY_ * kTx;
  static_assert(BQ % TY == 0 && BK % TY == 0 && BK % kTx == 0 && BQ <= kThreads);
};

// Per padded head size: keep each kernel's shared memory near 64-75 KB (2-3 blocks per SM on A100/H100) while
// giving every thread enough outputs that the inner loops are not bound by shared-memory reads.
template <int D>
struct Config;
template <>
struct Config<32> {
  using Fwd = Tiles<64, 64, 16>;
  using BwdKv = Tiles<64, 64, 16>;
  using BwdQ = Tiles<64, 64, 16>;
};
template <>
struct Config<64> {
  using Fwd = Tiles<64, 64, 16>;
  using BwdKv = Tiles<32, 64, 16>;
  using BwdQ = Tiles<64, 32, 16>;
};
template <>
struct Config<128> {
  using Fwd = Tiles<64, 32, 16>;
  using BwdKv = Tiles<32, 32, 8>;
  using BwdQ = Tiles<32, 32, 8>;
};

// Shared-memory row strides (odd, so a column read by 16 threads on 16 rows hits 16 banks).
template <int D>
constexpr int kLd = D + 1;
template <class Cfg>
constexpr int kLdp = Cfg::BK + 1;

template <int D, class Cfg>
constexpr size_t forward_smem_bytes() {  // Q, K, V tiles + P Z tile
  return sizeof(float) * ((Cfg::BQ + 2 * Cfg::BK) * kLd<D> + Cfg::BQ * kLdp<Cfg>);
}
template <int D, class Cfg>
constexpr size_t backward_smem_bytes(int score_tiles) {  // Q, dO, K, V tiles + P Z / dS tiles + lse, Dv
  return sizeof(float) * (2 * (Cfg::BQ + Cfg::BK) * kLd<D> + score_tiles * Cfg::BQ * kLdp<Cfg> + 2 * Cfg::BQ);
}

// Rows [row0, row0 + ROWS) x channels [0, D) of a global matrix with row stride ld, of which the first `rows`
// rows and `hs` channels are real, into a shared tile of stride D + 1. The padding is zero-filled so it adds
// nothing to the dot products. Consecutive threads read consecutive channels (coalesced). In: float, or bf16
// (qkv stored in bf16 under bf16 compute), widened to fp32.
template <int ROWS, int D, int NT, typename In>
__device__ inline void load_tile(float* dst, const In* src, int64_t ld, int row0, int rows, int hs) {
  for (int idx = threadIdx.x; idx < ROWS * D; idx += NT) {
    const int r = idx / D, c = idx % D, row = row0 + r;
    dst[r * kLd<D> + c] = row < rows && c < hs ? load_value(src + static_cast<int64_t>(row) * ld + c) : 0.0f;
  }
}

// src[row0 + r] for r < ROWS (0 past `rows`).
template <int ROWS, int NT>
__device__ inline void load_rows(float* dst, const float* src, int row0, int rows) {
  for (int r = threadIdx.x; r < ROWS; r += NT) dst[r] = row0 + r < rows ? src[row0 + r] : 0.0f;
}

// Micro-tile products over shared tiles; thread (ty, tx) owns rows ty + TY*i and columns tx + kTx*j of acc.
// The k loop runs in ascending order: a fixed summation order.
// acc += A B^T (A[row][k], B[col][k]).
template <int MI, int MJ, int K, int TY, int LDA, int LDB>
__device__ inline void gemm_abt(float (&acc)[MI][MJ], const float* a, const float* b, int ty, int tx) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[MI], bv[MJ];
#pragma unroll
    for (int i = 0; i < MI; ++i) av[i] = a[(ty + TY * i) * LDA + k];
#pragma unroll
    for (int j = 0; j < MJ; ++j) bv[j] = b[(tx + kTx * j) * LDB + k];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < MJ; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// acc += A B (A[row][k], B[k][col]).
template <int MI, int MJ, int K, int TY, int LDA, int LDB>
__device__ inline void gemm_ab(float (&acc)[MI][MJ], const float* a, const float* b, int ty, int tx) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[MI], bv[MJ];
#pragma unroll
    for (int i = 0; i < MI; ++i) av[i] = a[(ty + TY * i) * LDA + k];
#pragma unroll
    for (int j = 0; j < MJ; ++j) bv[j] = b[k * LDB + tx + kTx * j];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < MJ; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// acc += A^T B (A[k][row], B[k][col]).
template <int MI, int MJ, int K, int TY, int LDA, int LDB>
__device__ inline void gemm_atb(float (&acc)[MI][MJ], const float* a, const float* b, int ty, int tx) {
#pragma unroll 4
  for (int k = 0; k < K; ++k) {
    float av[MI], bv[MJ];
#pragma unroll
    for (int i = 0; i < MI; ++i) av[i] = a[k * LDA + ty + TY * i];
#pragma unroll
    for (int j = 0; j < MJ; ++j) bv[j] = b[k * LDB + tx + kTx * j];
#pragma unroll
    for (int i = 0; i < MI; ++i) {
#pragma unroll
      for (int j = 0; j < MJ; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// Max / sum over the kTx threads of a tile row (one half warp). The xor butterfly leaves the bitwise same
// value in every lane, so all threads of a row agree on m and l.
__device__ inline float row_max(float v) {
#pragma unroll
  for (int o = kTx / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float row_sum(float v) {
#pragma unroll
  for (int o = kTx / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int D, class Cfg, typename In, typename Out>
__global__ void __launch_bounds__(Cfg::kThreads)
    attention_forward_kernel(Out* out, float* lse, const In* qkv, int T, int C, int NH, int hs, float scale,
                             DropoutMask drop, float keep, int sections) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, TY = Cfg::TY, NT = Cfg::kThreads;
  constexpr int LD = kLd<D>, LDP = kLdp<Cfg>;
  constexpr int MI = BQ / TY, MJ = BK / kTx, MD = D / kTx;
  extern __shared__ float smem[];
  float* sq = smem;
  float* sk = sq + BQ * LD;
  float* sv = sk + BK * LD;
  float* sp = sv + BK * LD;

  const int ty = threadIdx.x / kTx, tx = threadIdx.x % kTx;
  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const In* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
  const In* k = q + C;
  const In* v = q + 2 * C;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  load_tile<BQ, D, NT>(sq, q, C3, q0, T, hs);
  float o[MI][MD] = {};
  float m[MI], l[MI];
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
  }
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile
  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // everyone is done with the previous K, V and P tiles
    load_tile<BK, D, NT>(sk, k, C3, k0, T, hs);
    load_tile<BK, D, NT>(sv, v, C3, k0, T, hs);
    __syncthreads();
    float s[MI][MJ] = {};
    gemm_abt<MI, MJ, D, TY, LD, LD>(s, sq, sk, ty, tx);
#pragma unroll
    for (int i = 0; i < MI; ++i) {
      const int r = ty + TY * i, t = q0 + r;
      const uint64_t row_first = first + static_cast<uint64_t>(t) * T;  // mask index of (t, 0)
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < MJ; ++j) {
        s[i][j] = k0 + tx + kTx * j <= t ? s[i][j] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
      // Finite: tile 0 holds key 0, which every row sees; a later fully masked tile leaves m unchanged.
      const float m_new = fmaxf(m[i], row_max(mx));
      const float alpha = expf(m[i] - m_new);  // 0 on the first tile (m = -inf)
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < MJ; ++j) {
        const int c = tx + kTx * j, t2 = k0 + c;
        const float p = expf(s[i][j] - m_new);  // 0 above the diagonal
        sum += p;
        // Padded rows (t >= T) are never written: skip their RNG draws.
        const float z = drop.active() && t2 <= t && t < T ? dropout_factor(drop, keep, row_first + t2) : 1.0f;
        sp[r * LDP + c] = p * z;
      }
      l[i] = l[i] * alpha + row_sum(sum);  // normaliser of the undropped P
      m[i] = m_new;
#pragma unroll
      for (int d = 0; d < MD; ++d) o[i][d] *= alpha;
    }
    __syncthreads();  // the P Z tile is complete
    gemm_ab<MI, MD, BK, TY, LDP, LD>(o, sp, sv, ty, tx);
  }

#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int t = q0 + ty + TY * i;
    if (t >= T) continue;
    const float inv = 1.0f / l[i];
    Out* orow = out + (static_cast<int64_t>(b) * T + t) * C + static_cast<int64_t>(h) * hs;
#pragma unroll
    for (int d = 0; d < MD; ++d) {
      const int c = tx + kTx * d;
      if (c < hs) store_value(orow + c, o[i][d] * inv);
    }
    if (tx == 0) lse[static_cast<int64_t>(bh) * T + t] = m[i] + logf(l[i]);
  }
}

// Dv for every (b, h, t): one warp per row, lanes stride the channels, then a fixed-order warp sum. kRound: an
// fp32 out rounded to bf16 first.
template <typename In, bool kRound, typename G>
__global__ void attention_row_dot_kernel(float* dv, const G* dout, const In* out, int64_t rows, int T, int C, int NH,
                                         int hs) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= rows) return;  // whole warps leave together, so warp_sum below has all 32 lanes
  const int lane = threadIdx.x % kWarp;
  const int t = static_cast<int>(row % T);
  const int64_t bh = row / T, b = bh / NH, h = bh % NH;
  const int64_t off = (b * T + t) * C + h * hs;
  float acc = 0.0f;
  for (int c = lane; c < hs; c += kWarp) {
    const float o = load_value(out + off + c);
    acc = fmaf(load_value(dout + off + c), kRound ? round_bf16(o) : o, acc);
  }
  acc = warp_sum(acc);
  if (lane == 0) dv[row] = acc;
}

// For query rows q0.. and key rows k0.. (shared tiles of one (b, h)): P = exp(scale q.k - lse), zero above the
// diagonal and on padded rows, and dS = P (Z dO.v - Dv). Writes P Z to sp (when kWriteP) and dS to sds, both
// [BQ][BK + 1]. dS is not yet multiplied by scale (the callers scale their sums once at the end).
template <bool kWriteP, int D, class Cfg>
__device__ inline void score_grads(float* sp, float* sds, const float* sq, const float* sk, const float* sdo,
                                   const float* sv, const float* slse, const float* sdv, int q0, int k0, int T,
                                   float scale, const DropoutMask& drop, float keep, uint64_t first, int ty, int tx) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, TY = Cfg::TY;
  constexpr int LD = kLd<D>, LDP = kLdp<Cfg>;
  constexpr int MI = BQ / TY, MJ = BK / kTx;
  float s[MI][MJ] = {}, dp[MI][MJ] = {};
  gemm_abt<MI, MJ, D, TY, LD, LD>(s, sq, sk, ty, tx);
  gemm_abt<MI, MJ, D, TY, LD, LD>(dp, sdo, sv, ty, tx);
#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int r = ty + TY * i, t = q0 + r;
    const uint64_t row_first = first + static_cast<uint64_t>(t) * T;  // mask index of (t, 0)
#pragma unroll
    for (int j = 0; j < MJ; ++j) {
      const int c = tx + kTx * j, t2 = k0 + c;
      const bool visible = t < T && t2 <= t;
      const float p = visible ? expf(s[i][j] * scale - slse[r]) : 0.0f;
      const float z = visible && drop.active() ? dropout_factor(drop, keep, row_first + t2) : 1.0f;
      if constexpr (kWriteP) sp[r * LDP + c] = p * z;
      sds[r * LDP + c] = p * (z * dp[i][j] - sdv[r]);
    }
  }
}

// dK, dV for one key tile of one (b, h): sums over query tiles in ascending order, each in ascending row order.
template <int D, class Cfg, typename In, typename G>
__global__ void __launch_bounds__(Cfg::kThreads)
    attention_backward_kv_kernel(In* dqkv, const G* dout, const In* qkv, const float* lse, const float* dvec, int T,
                                 int C, int NH, int hs, float scale, DropoutMask drop, float keep, int sections) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, TY = Cfg::TY, NT = Cfg::kThreads;
  constexpr int LD = kLd<D>, LDP = kLdp<Cfg>;
  constexpr int MK = BK / TY, MD = D / kTx;
  extern __shared__ float smem[];
  float* sk = smem;
  float* sv = sk + BK * LD;
  float* sq = sv + BK * LD;
  float* sdo = sq + BQ * LD;
  float* sp = sdo + BQ * LD;
  float* sds = sp + BQ * LDP;
  float* slse = sds + BQ * LDP;
  float* sdv = slse + BQ;

  const int ty = threadIdx.x / kTx, tx = threadIdx.x % kTx;
  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int k0 = tile.rank * BK;  // rank 0: the first key tile, seen by the most queries
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
  const In* q = qkv + qkv_off;
  const In* k = q + C;
  const In* v = q + 2 * C;
  const G* dO = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* dvec_bh = dvec + static_cast<int64_t>(bh) * T;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  load_tile<BK, D, NT>(sk, k, C3, k0, T, hs);
  load_tile<BK, D, NT>(sv, v, C3, k0, T, hs);
  float dk[MK][MD] = {}, dv[MK][MD] = {};
  const int num_qt = (T + BQ - 1) / BQ;
  for (int qt = k0 / BQ; qt < num_qt; ++qt) {  // from the tile holding query k0 (the diagonal) down
    const int q0 = qt * BQ;
    __syncthreads();  // everyone is done with the previous Q, dO, P Z and dS tiles
    load_tile<BQ, D, NT>(sq, q, C3, q0, T, hs);
    load_tile<BQ, D, NT>(sdo, dO, C, q0, T, hs);
    load_rows<BQ, NT>(slse, lse_bh, q0, T);
    load_rows<BQ, NT>(sdv, dvec_bh, q0, T);
    __syncthreads();
    score_grads<true, D, Cfg>(sp, sds, sq, sk, sdo, sv, slse, sdv, q0, k0, T, scale, drop, keep, first, ty, tx);
    __syncthreads();  // the P Z and dS tiles are complete
    gemm_atb<MK, MD, BQ, TY, LDP, LD>(dv, sp, sdo, ty, tx);
    gemm_atb<MK, MD, BQ, TY, LDP, LD>(dk, sds, sq, ty, tx);
  }

#pragma unroll
  for (int i = 0; i < MK; ++i) {
    const int t2 = k0 + ty + TY * i;
    if (t2 >= T) continue;
    In* dk_row = dqkv + qkv_off + static_cast<int64_t>(t2) * C3 + C;
    In* dv_row = dk_row + C;
#pragma unroll
    for (int d = 0; d < MD; ++d) {
      const int c = tx + kTx * d;
      if (c < hs) {
        store_value(dk_row + c, dk[i][d] * scale);
        store_value(dv_row + c, dv[i][d]);
      }
    }
  }
}

// dQ for one query tile of one (b, h): sums over key tiles in ascending order.
template <int D, class Cfg, typename In, typename G>
__global__ void __launch_bounds__(Cfg::kThreads)
    attention_backward_q_kernel(In* dqkv, const G* dout, const In* qkv, const float* lse, const float* dvec, int T,
                                int C, int NH, int hs, float scale, DropoutMask drop, float keep, int sections) {
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, TY = Cfg::TY, NT = Cfg::kThreads;
  constexpr int LD = kLd<D>, LDP = kLdp<Cfg>;
  constexpr int MI = BQ / TY, MD = D / kTx;
  extern __shared__ float smem[];
  float* sq = smem;
  float* sdo = sq + BQ * LD;
  float* sk = sdo + BQ * LD;
  float* sv = sk + BK * LD;
  float* sds = sv + BK * LD;
  float* slse = sds + BQ * LDP;
  float* sdv = slse + BQ;

  const int ty = threadIdx.x / kTx, tx = threadIdx.x % kTx;
  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * hs;
  const In* q = qkv + qkv_off;
  const In* k = q + C;
  const In* v = q + 2 * C;
  const G* dO = dout + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * hs;
  const uint64_t first = static_cast<uint64_t>(bh) * T * T;

  load_tile<BQ, D, NT>(sq, q, C3, q0, T, hs);
  load_tile<BQ, D, NT>(sdo, dO, C, q0, T, hs);
  load_rows<BQ, NT>(slse, lse + static_cast<int64_t>(bh) * T, q0, T);
  load_rows<BQ, NT>(sdv, dvec + static_cast<int64_t>(bh) * T, q0, T);
  float dq[MI][MD] = {};
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile
  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * BK;
    __syncthreads();  // everyone is done with the previous K, V and dS tiles (and the first Q loads are in)
    load_tile<BK, D, NT>(sk, k, C3, k0, T, hs);
    load_tile<BK, D, NT>(sv, v, C3, k0, T, hs);
    __syncthreads();
    score_grads<false, D, Cfg>(nullptr, sds, sq, sk, sdo, sv, slse, sdv, q0, k0, T, scale, drop, keep, first, ty, tx);
    __syncthreads();  // the dS tile is complete
    gemm_ab<MI, MD, BK, TY, LDP, LD>(dq, sds, sk, ty, tx);
  }

#pragma unroll
  for (int i = 0; i < MI; ++i) {
    const int t = q0 + ty + TY * i;
    if (t >= T) continue;
    In* dq_row = dqkv + qkv_off + static_cast<int64_t>(t) * C3;
#pragma unroll
    for (int d = 0; d < MD; ++d) {
      const int c = tx + kTx * d;
      if (c < hs) store_value(dq_row + c, dq[i][d] * scale);
    }
  }
}

// Inference over a KV cache (attention_forward_rows): one block per (query row, head). The keys go by in chunks of
// kRowsThreads, each thread scoring one key of a chunk; then, for the output, each thread owns one element of the
// head (hs <= 128, the block's threads). An online softmax over the chunks, as the flash kernels': the sum and the
// output are rescaled when a chunk raises the row's max. Every sum runs in a fixed order (deterministic). The key
// reads are strided (a row a thread) but one token's attention is small next to its GEMMs' weight reads.
constexpr int kRowsThreads = 128;

template <typename In>
__global__ void attention_rows_kernel(In* out, const In* qkv, int t0, int C, int hs, float scale) {
  __shared__ float sq[kRowsThreads];
  __shared__ float sp[kRowsThreads];
  __shared__ float red[kWarp];
  const int t = t0 + static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y), j = static_cast<int>(threadIdx.x);
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const In* q = qkv + static_cast<int64_t>(t) * C3 + h * hs;
  const In* k = qkv + C + h * hs;
  const In* v = qkv + 2 * C + h * hs;
  if (j < hs) sq[j] = load_value(q + j);
  __syncthreads();
  float m = -INFINITY, l = 0.0f, acc = 0.0f;
  for (int k0 = 0; k0 <= t; k0 += kRowsThreads) {
    const int t2 = k0 + j;
    float s = -INFINITY;
    if (t2 <= t) {
      const In* kr = k + static_cast<int64_t>(t2) * C3;
      float dot = 0.0f;
      for (int d = 0; d < hs; ++d) dot += sq[d] * load_value(kr + d);
      s = dot * scale;
    }
    const float m_new = fmaxf(m, block_max(s, red));  // finite: key 0 is in the first chunk
    const float p = t2 <= t ? expf(s - m_new) : 0.0f;
    const float alpha = expf(m - m_new);  // 0 on the first chunk (m = -inf)
    l = l * alpha + block_sum(p, red);
    sp[j] = p;
    __syncthreads();
    if (j < hs) {
      const int n = t + 1 - k0 < kRowsThreads ? t + 1 - k0 : kRowsThreads;
      float a = 0.0f;
      for (int i = 0; i < n; ++i) a += sp[i] * load_value(v + static_cast<int64_t>(k0 + i) * C3 + j);
      acc = acc * alpha + a;
    }
    __syncthreads();  // the next chunk rewrites sp
    m = m_new;
  }
  if (j < hs) store_value(out + static_cast<int64_t>(blockIdx.x) * C + h * hs + j, acc / l);
}

// Validates the shape; returns the head size.
int head_size(int B, int T, int C, int NH) {
  GPT_CHECK(B >= 0 && T >= 0 && NH > 0 && C > 0 && C % NH == 0);
  const int hs = C / NH;
  GPT_CHECK(hs <= 128);
  GPT_CHECK(static_cast<int64_t>(B) * NH <= 65535);  // gridDim.y
  return hs;
}

template <int D, typename In, typename Out>
void forward_impl(Out* out, float* lse, const In* qkv, int B, int T, int C, int NH, const DropoutMask& drop,
                  cudaStream_t stream) {
  using Cfg = typename Config<D>::Fwd;
  constexpr size_t smem = forward_smem_bytes<D, Cfg>();
  const auto kernel = attention_forward_kernel<D, Cfg, In, Out>;
  set_smem(kernel, smem);
  const int hs = C / NH;
  const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
  kernel<<<grid, Cfg::kThreads, smem, stream>>>(out, lse, qkv, T, C, NH, hs, 1.0f / std::sqrt(static_cast<float>(hs)),
                                                drop, keep_scale(drop), attention_sections(B * NH, T, hs, sizeof(In)));
  GPT_CUDA_CHECK_LAUNCH();
}

template <int D, typename In, typename G>
void backward_impl(In* dqkv, const G* dout, const In* qkv, const float* lse, const float* dvec, int B, int T, int C,
                   int NH, const DropoutMask& drop, cudaStream_t stream) {
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float keep = keep_scale(drop);
  const int sections = attention_sections(B * NH, T, hs, sizeof(In));
  {
    using Cfg = typename Config<D>::BwdKv;
    constexpr size_t smem = backward_smem_bytes<D, Cfg>(2);
    const auto kernel = attention_backward_kv_kernel<D, Cfg, In, G>;
    set_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BK)), static_cast<unsigned>(B * NH));
    kernel<<<grid, Cfg::kThreads, smem, stream>>>(dqkv, dout, qkv, lse, dvec, T, C, NH, hs, scale, drop, keep,
                                                  sections);
    GPT_CUDA_CHECK_LAUNCH();
  }
  {
    using Cfg = typename Config<D>::BwdQ;
    constexpr size_t smem = backward_smem_bytes<D, Cfg>(1);
    const auto kernel = attention_backward_q_kernel<D, Cfg, In, G>;
    set_smem(kernel, smem);
    const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
    kernel<<<grid, Cfg::kThreads, smem, stream>>>(dqkv, dout, qkv, lse, dvec, T, C, NH, hs, scale, drop, keep,
                                                  sections);
    GPT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void attention_forward(TensorPtr out, float* lse, ConstTensorPtr qkv, int B, int T, int C, int NH,
                       const DropoutMask& drop, cudaStream_t stream) {
  const int hs = head_size(B, T, C, NH);
  GPT_CHECK(out.dtype == qkv.dtype);
  if (B == 0 || T == 0) return;
  with_dtype(qkv, [&](auto* q) {
    auto* o = static_cast<element_t<decltype(q)>*>(out.data);  // out has qkv's dtype
    with_head_size(hs, [&](auto d) { forward_impl<decltype(d)::value>(o, lse, q, B, T, C, NH, drop, stream); });
  });
}

void attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH, cudaStream_t stream) {
  const int hs = head_size(1, T, C, NH);
  GPT_CHECK(out.dtype == qkv.dtype && 0 <= t0 && t0 < T);
  with_dtype(qkv, [&](auto* q) {
    using In = element_t<decltype(q)>;
    const dim3 grid(static_cast<unsigned>(T - t0), static_cast<unsigned>(NH));
    attention_rows_kernel<In><<<grid, kRowsThreads, 0, stream>>>(static_cast<In*>(out.data), q, t0, C, hs,
                                                                 1.0f / std::sqrt(static_cast<float>(hs)));
  });
  GPT_CUDA_CHECK_LAUNCH();
}

size_t attention_backward_scratch_bytes(int B, int T, int C, int NH) {
  (void)C;
  return cuda_workspace::attention_backward(B, T, NH);  // Dv(B,NH,T)
}

void attention_row_dot(float* dv, ConstTensorPtr dout, ConstTensorPtr out, bool round_out, int B, int T, int C, int NH,
                       cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  constexpr int kThreads = 256;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, kRowsPerBlock)));
  with_dtype(dout, [&](auto* dy) {
    using G = element_t<decltype(dy)>;
    if (out.is_bf16()) {
      attention_row_dot_kernel<bf16, false, G>
          <<<grid, kThreads, 0, stream>>>(dv, dy, out.as_bf16(), rows, T, C, NH, C / NH);
    } else if (round_out) {
      attention_row_dot_kernel<float, true, G>
          <<<grid, kThreads, 0, stream>>>(dv, dy, out.as_f32(), rows, T, C, NH, C / NH);
    } else {
      attention_row_dot_kernel<float, false, G>
          <<<grid, kThreads, 0, stream>>>(dv, dy, out.as_f32(), rows, T, C, NH, C / NH);
    }
  });
  GPT_CUDA_CHECK_LAUNCH();
}

void attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* lse,
                        int B, int T, int C, int NH, const DropoutMask& drop, void* scratch, cudaStream_t stream) {
  const int hs = head_size(B, T, C, NH);
  GPT_CHECK(dqkv.dtype == qkv.dtype && out.dtype == qkv.dtype);
  if (B == 0 || T == 0) return;
  float* dvec = static_cast<float*>(scratch);
  attention_row_dot(dvec, dout, out, false, B, T, C, NH, stream);
  with_dtype(qkv, [&](auto* q) {
    auto* dq = static_cast<element_t<decltype(q)>*>(dqkv.data);  // dqkv has qkv's dtype
    with_dtype(dout, [&](auto* dy) {
      with_head_size(
          hs, [&](auto d) { backward_impl<decltype(d)::value>(dq, dy, q, lse, dvec, B, T, C, NH, drop, stream); });
    });
  });
}

}  // namespace gpt::cuda
