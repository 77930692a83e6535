// The backward of the mma.sync attention kernels (attention_mma.cu says how they work; attention_mma.cuh holds what
// both files share): D = rowsum(dO * O), then a dK/dV kernel over key tiles and a dQ kernel over query tiles, each
// warp summing its own rows in a fixed order (deterministic, no atomics).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/attention_wgmma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {

namespace {

using namespace attention_mma_detail;

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
// columns: queries; this (b, h)'s block first) for attention_backward_q_ds: each 16 x 16 block whose queries do not
// precede its keys (dS's blocks at and below its diagonal; the masked elements of the diagonal's blocks 0), no other.
template <int D, bool kDrop, bool kLean, bool kStoreDs = false>
__device__ __forceinline__ void attention_backward_kv_mma(bf16* dqkv, const bf16* dob, const bf16* qkv,
                                                          const float* lse, const float* dvec, int T, int C, int NH,
                                                          float scale, float scale_log2, DropoutMask drop, float keep,
                                                          int sections, bf16* ds = nullptr, int64_t ds_ld = 0) {
  using Cfg = BwdKvCfg<D, kLean>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD, KD = D / 16, ND = D / 8, NC = BQ / 16;
  constexpr bool kKeep = Cfg::kKeep;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sk = reinterpret_cast<bf16*>(smem_raw + Cfg::kK);
  bf16* sv = reinterpret_cast<bf16*>(smem_raw + Cfg::kV);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int k0 = tile.rank * BK;  // rank 0: the first key tile, seen by the most queries
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
  // Query tile qt's Q and dO into stage s (cp.async); its lse and D through QueryRowStats.
  auto fetch_tiles = [&](int qt, int s) {
    copy_tile_async<BQ, D, LD>(stage_q(s), q, C3, qt * BQ, T);
    copy_tile_async<BQ, D, LD>(stage_do(s), dO, C, qt * BQ, T);
  };
  QueryRowStats<BQ> rows;
  auto load_rows = [&](int qt) { rows.load(lse_bh, dvec_bh, qt, T); };
  auto store_rows_to = [&](int s) { rows.store(stage_lse(s), stage_dv(s)); };
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
                                     int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep,
                                     int sections) {
  attention_backward_kv_mma<D, kDrop, false>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep,
                                             sections);
}

// The lean configuration in at most 168 registers, for 3 blocks per SM (D 32 and 64 without dropout: sm_90 ptxas,
// 167 registers at D = 64, no spills, against 242).
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    attention_backward_kv_mma3_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                      int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep,
                                      int sections) {
  attention_backward_kv_mma<D, false, true>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep,
                                            sections);
}

// The same, also writing dS^T for attention_backward_q_ds_kernel (ds: B NH blocks of ds_ld x ds_ld).
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    attention_backward_kv_ds_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                    int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep,
                                    bf16* ds, int64_t ds_ld, int sections) {
  attention_backward_kv_mma<D, false, true, true>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep,
                                                  sections, ds, ds_ld);
}

// dQ for one 64-query tile of one (b, h); warp w owns queries q0 + 16 w.. and sums over the key tiles in
// ascending order.
template <int D, bool kDrop>
__device__ __forceinline__ void attention_backward_q_mma(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse,
                                                         const float* dvec, int T, int C, int NH, float scale,
                                                         float scale_log2, DropoutMask drop, float keep, int sections) {
  using Cfg = BwdQCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD, KD = D / 16, ND = D / 8, NC = BK / 16;
  constexpr bool kKeep = Cfg::kKeep;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kQ);
  bf16* sdo = reinterpret_cast<bf16*>(smem_raw + Cfg::kDo);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
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
        add_ds_k<D, LD>(dq[0], dsa, sk, c, lane);
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
                                    int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep,
                                    int sections) {
  attention_backward_q_mma<D, kDrop>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep, sections);
}

// The same in at most 168 registers, for 3 blocks per SM (D = 64 without dropout: 168 against 175, no spills).
template <int D>
__global__ void __launch_bounds__(kThreads, 3)
    attention_backward_q_mma3_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec,
                                     int T, int C, int NH, float scale, float scale_log2, DropoutMask drop, float keep,
                                     int sections) {
  attention_backward_q_mma<D, false>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep, sections);
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
                                   float scale, int sections) {
  using Cfg = BwdQDsCfg<D>;
  constexpr int BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD, LDS = Cfg::LDS, ND = D / 8, NC = BK / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * D;
  const bf16* k = qkv + qkv_off + C;
  const bf16* ds_bh = ds + static_cast<int64_t>(bh) * ds_ld * ds_ld + q0;  // column q0 of row 0
  const int num_kt = (min(q0 + BQ, T) - 1) / BK + 1;  // key tiles up to the last real query of this tile

  auto stage_ds = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * Cfg::kStageBytes); };
  auto stage_k = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * Cfg::kStageBytes + Cfg::kDsTile); };
  // ds_ld (T rounded up to 64) holds every key tile whole: no row of a dS^T tile is past it.
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
      add_ds_k<D, LD>(dq[0], dsa, sk, c, lane);
    }
    __syncthreads();  // everyone is done with stage s before iteration kt + 1 refills it
  }

  if (qw >= T) return;  // warp-uniform; no barrier follows
  // The warp's own 16 rows of stage 0's K tile (free after the last barrier) stage its output.
  store_rows<1, D, LD>(dqkv + qkv_off, C3, dq, scale, stage_k(0) + qr * LD, qw, T, lane);
}

// The backward at D <= 64 without dropout runs its lean kernels, 3 blocks (12 warps) per SM, unless
// GPT_ATTENTION_BWD_BLOCKS=2 (read at each launch) asks for the 2 of the other cases. On an H200 both 2-block
// backward kernels ran at 12% occupancy with no warp eligible in 61% of cycles. The lean dK/dV kernel streams 32-query
// tiles and reads K and V from shared memory per tile (as at D = 128); the lean dQ kernel is the same code under a
// tighter register bound. Measured with attention_mma.cu's 16-row forward; the same products and sums in the same
// order.
bool backward_blocks3() { return !env_is("GPT_ATTENTION_BWD_BLOCKS", "2"); }

// GPT_ATTENTION_DQ=recompute (read at each launch): the lean backward's dQ kernel recomputes S, P and dP from Q, K,
// V and dO even where the scratch keeps dS^T (attention_backward_q_ds_kernel), as the other configurations always do.
bool dq_from_kept_ds() { return !env_is("GPT_ATTENTION_DQ", "recompute"); }

// ds (lean kernels only; null: none kept): the dK/dV kernel writes dS^T there and the dQ kernel reads it. On
// wgmma (sm_90) the kernels also sum dqkv_bias (when not null; attention_backward_mma) through the partials at
// bias_partials; returns whether they did.
template <int D, bool kLean>
bool backward_launch(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec, int B, int T,
                     int C, int NH, const DropoutMask& drop, bf16* ds, float* dqkv_bias, float* bias_partials,
                     cudaStream_t stream) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(D)), scale_log2 = scale * kLog2e;
  const float keep = keep_scale(drop);
  if constexpr (kLean) {
    if (ds != nullptr && D == 64 && attention_wgmma_backward_usable(C, NH, drop.active())) {  // sm_90: on wgmma
      // GPT_ATTENTION_WGMMA_BIAS=0: the bias left to the caller's bias_backward, as before the kernels summed it.
      float* bias = env_is("GPT_ATTENTION_WGMMA_BIAS", "0") ? nullptr : dqkv_bias;
      attention_backward_wgmma(dqkv, dob, qkv, lse, dvec, B, T, C, NH, ds, cuda_workspace::attention_ds_stride(T), bias,
                               bias_partials, stream);
      return bias != nullptr;
    }
  }
  const int sections = attention_sections(B * NH, T, D, sizeof(bf16));
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
                                                 ds_ld, sections);
        GPT_CUDA_CHECK_LAUNCH();
      }
      using Cfg = BwdQDsCfg<D>;
      constexpr size_t smem = Cfg::kBytes;
      const auto kernel = attention_backward_q_ds_kernel<D>;
      set_smem(kernel, smem);
      prefer_shared_memory(kernel);  // 4 blocks of 36 KB at D = 64: past the default carveout (135 KB on the H200)
      const dim3 grid(static_cast<unsigned>(ceil_div(T, Cfg::BQ)), static_cast<unsigned>(B * NH));
      kernel<<<grid, kThreads, smem, stream>>>(dqkv, qkv, ds, ds_ld, T, C, NH, scale, sections);
      GPT_CUDA_CHECK_LAUNCH();
      return false;
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
    kernel<<<grid, kThreads, smem, stream>>>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep,
                                             sections);
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
    kernel<<<grid, kThreads, smem, stream>>>(dqkv, dob, qkv, lse, dvec, T, C, NH, scale, scale_log2, drop, keep,
                                             sections);
    GPT_CUDA_CHECK_LAUNCH();
  }
  return false;
}

template <int D>
bool backward_impl(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse, const float* dvec, int B, int T,
                   int C, int NH, const DropoutMask& drop, bf16* ds, float* dqkv_bias, float* bias_partials,
                   cudaStream_t stream) {
  if constexpr (D <= 64) {
    if (!drop.active() && backward_blocks3()) {
      return backward_launch<D, true>(dqkv, dob, qkv, lse, dvec, B, T, C, NH, drop, dq_from_kept_ds() ? ds : nullptr,
                                      dqkv_bias, bias_partials, stream);
    }
  }
  return backward_launch<D, false>(dqkv, dob, qkv, lse, dvec, B, T, C, NH, drop, nullptr, nullptr, nullptr, stream);
}

}  // namespace

size_t attention_backward_mma_scratch_bytes(int B, int T, int C, int NH, bool dropout) {
  return cuda_workspace::attention_backward_mma(B, T, C, NH, dropout);  // D (dO comes in bf16), dS^T
}

bool attention_backward_mma(TensorPtr dqkv, const bf16* dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* lse,
                            int B, int T, int C, int NH, const DropoutMask& drop, float* dqkv_bias, void* scratch,
                            cudaStream_t stream) {
  const int hs = check_shape(B, T, C, NH);
  GPT_CHECK(dqkv.is_bf16() && qkv.is_bf16() && out.is_bf16());
  if (B == 0 || T == 0) return true;  // no rows: no bias gradient to add
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
  // The bias partials after it (used on wgmma only).
  float* bias_partials =
      ds != nullptr
          ? reinterpret_cast<float*>(reinterpret_cast<char*>(ds) + cuda_workspace::attention_ds_bytes(B, T, NH))
          : nullptr;
  bool summed = false;
  with_head_size(hs, [&](auto d) {
    summed = backward_impl<decltype(d)::value>(dqkv.as_bf16(), dout, qkv.as_bf16(), lse, dvec, B, T, C, NH, drop, ds,
                                               dqkv_bias, bias_partials, stream);
  });
  return summed;
}

}  // namespace gpt::cuda
