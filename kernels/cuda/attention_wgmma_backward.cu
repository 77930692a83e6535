// The wgmma attention backward (attention_wgmma.h): the dK/dV kernel, which also writes dS^T, and the dQ kernel over
// it. Read attention_wgmma.cu's opening comment and attention_mma_backward.cu first.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mbarrier_ptx.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace gpt::cuda {

namespace {

using namespace attention_wgmma_detail;

// dK, dV for one 64-key tile of one (b, h), and dS^T into ds, as attention_mma_backward.cu's
// attention_backward_kv_mma with kStoreDs (read it first), on wgmma: the warpgroup's 64 rows are the tile's keys
// (warp w: keys k0 + 16 w..), summed over query tiles of BQ (32 or 64; 128 warp-specialised) in ascending order.
//  - S^T = K Q^T and dP^T = V dO^T: m64nBQk16 from shared memory (K, V, and Q, dO as B^T, all K-major), 4 k-steps
//    each, in one batch.
//  - P^T and dS^T element by element as there (lse and D per query column, from the stage), packed to bf16 A
//    fragments; dS^T stored from them (every 16 x 16 block of the tiles visited, the masked ones as zeros).
//  - dV += P^T dO and dK += dS^T Q: m64n64k16 with A from those registers and dO, Q from shared memory, MN-major.
// kOverlap (GPT_ATTENTION_WGMMA_OVERLAP=1 or bwd, an experiment not yet measured on a GPU): S^T and dP^T in separate
// commit groups, so P^T is computed while dP^T's products run and dS^T while dV's do; the same values.
// kWG warpgroups per block (GPT_ATTENTION_WGMMA_WG2 kv: 2), each with its own 64 keys, sharing the Q and dO tiles; a
// warpgroup starts at the query tile of its first key (the block's first ones are past its keys at 2).
// At 32 queries per step (not overlapped) four warpgroups per SM: at most 128 registers (ptxas: 128 with one
// warpgroup, and 52 bytes of spills with two).
// kKVRegs (GPT_ATTENTION_WGMMA_RS kv): S^T's and dP^T's A, the warpgroup's K and V rows, from registers
// (load_a_sw128 once, at the first query tile) instead of from shared memory at every product; three blocks per SM.
// kStageDs: each warp's dS^T block (16 keys x BQ queries) goes through its shared staging rows, then to global memory
// as whole 16-byte pieces of whole rows (2 stores per thread at BQ 32, 4 at 64, where the fragments take 4 NC of 4
// bytes, each filling half of eight 32-byte sectors); GPT_ATTENTION_WGMMA_DS_STAGE=0 stores the fragments directly
// (the kernel as the H200 ran it; not yet measured against each other). The same values either way.
// kWS (GPT_ATTENTION_WGMMA_WS_KV=2 or 3: kWG, an experiment not yet run on a GPU; overlapped with OVERLAP=1 or bwd,
// else at 2 with K and V in registers under RS=kv): warp-specialised, as
// attention_wgmma_ws.cu's forward (read it): a producer warpgroup ahead of the kWG consumer ones, whose first warp
// copies the block's K and V, then each query tile's Q and dO (cp.async, landing on the stage's `full` mbarrier) and
// its lse and D (plain loads and stores, then an arrival on the same barrier: 64 arrivals a phase) into a ring of
// kWsStages stages, refilling a stage once every consumer warp released it (`empty`); no consumer copies or meets
// the whole block at a barrier. Each K/V slot is 9216 bytes (its warpgroup's staging rows at the end); one block
// per SM; the same values. ptxas allocates each consumer's code within setmaxnreg's count (240 registers at 2, 160
// at 3), not the launch's share (168, 128), so at 2 the tiles may be larger: GPT_ATTENTION_WGMMA_BQ=128 takes 128
// queries per step (S^T and dP^T as m64n128k16, FlashAttention-3's tile for head size 64: a quarter of 32's steps,
// barrier waits and lse/D loads, and twice 64's product width; 170 KB of shared memory; ptxas: no spills).
// Experiments not yet run on a GPU.
constexpr int kv_min_blocks(int bq, bool overlap, int wg, bool kv_regs, bool ws) {
  return ws ? 1 : bq == 32 && !overlap ? (kv_regs ? 3 : 4) / wg : 0;
}
template <int BQ, bool kOverlap, int kWG, bool kKVRegs = false, bool kStageDs = true, bool kWS = false>
__global__ void __launch_bounds__((kThreads * (kWG + (kWS ? 1 : 0))), kv_min_blocks(BQ, kOverlap, kWG, kKVRegs, kWS))
    attention_backward_kv_wgmma_kernel(bf16* dqkv, const bf16* dob, const bf16* qkv, const float* lse,
                                       const float* dvec, int T, int C, int NH, float scale, float scale_log2, bf16* ds,
                                       int64_t ds_ld, float* bias_partial, int sections) {
  using Cfg = BwdKvWgmmaCfg<BQ>;
  static_assert(!kWS || ((kWG == 2 || kWG == 3) && !(kOverlap && kKVRegs)));
  static_assert(BQ == 32 || BQ == 64 || (BQ == 128 && kWS && kWG == 2 && !kKVRegs && kStageDs));
  constexpr int NC = BQ / 16, kNT = kThreads * kWG, kKeys = kBK * kWG;  // the (consumer) threads and keys
  constexpr uint32_t kKVSlot = kWS ? kWsKVSlot : kTile;                 // a warpgroup's K (or V) tile's bytes
  constexpr int kStages = kWS ? kWsStages : 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  unsigned char* sk = base;  // kWG tiles of 64 keys each
  unsigned char* sv = base + kWG * kKVSlot;
  auto stage = [&](int s) { return base + 2 * kWG * kKVSlot + s * Cfg::kStageBytes; };
  auto stage_q = [&](int s) { return stage(s); };
  auto stage_do = [&](int s) { return stage(s) + Cfg::kQTile; };
  auto stage_lse = [&](int s) { return reinterpret_cast<float*>(stage(s) + 2 * Cfg::kQTile); };
  auto stage_dv = [&](int s) { return stage_lse(s) + BQ; };
  // warp: the block's consumer warps' (16 keys each, warpgroup after warpgroup; kWS: the producer's are -4..-1); wg:
  // this warp's warpgroup
  const int warp = static_cast<int>(threadIdx.x / kWarp) - (kWS ? 4 : 0), wg = kWG > 1 ? warp / 4 : 0,
            lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;
  unsigned char* ds_area = base + 2 * kWG * kKVSlot + kStages * Cfg::kStageBytes;
  // kStageDs: the warp's dS^T staging rows
  unsigned char* ds_stage = ds_area + warp * Cfg::kDsWarpBytes;
  uint64_t* kv_full = reinterpret_cast<uint64_t*>(ds_area + 4 * kWG * Cfg::kDsWarpBytes);  // kWS: its mbarriers
  uint64_t* full = kv_full + 1;
  uint64_t* empty = full + kStages;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int k0 = tile.rank * kKeys;  // rank 0: the first key tile, seen by the most queries
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * kD;
  const bf16* q = qkv + qkv_off;
  const bf16* dO = dob + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * kD;
  const float* lse_bh = lse + static_cast<int64_t>(bh) * T;
  const float* dvec_bh = dvec + static_cast<int64_t>(bh) * T;

  auto fetch_tiles = [&](int qt, int s) {  // not kWS's (its producer copies)
    if constexpr (!kWS) {
      copy_tile_sw128<BQ, kNT>(stage_q(s), q, C3, qt * BQ, T);
      copy_tile_sw128<BQ, kNT>(stage_do(s), dO, C, qt * BQ, T);
    }
  };
  QueryRowStats<BQ> rows;  // lse and D, a tile ahead (attention_mma.cuh)
  auto load_rows = [&](int qt) { rows.load(lse_bh, dvec_bh, qt, T); };
  auto store_rows_to = [&](int s) { rows.store(stage_lse(s), stage_dv(s)); };
  const int qt0 = k0 / BQ, num_qt = (T + BQ - 1) / BQ;  // from the tile holding query k0 (the diagonal) down
  // This warpgroup's first (its diagonal); none for a warpgroup whose keys all lie past T (and past dS^T's rows: at
  // 128 queries per step the tile of its first key would be the block's first, whose queries its dS^T rows lack).
  const int qt_wg = BQ > kBK && k0 + kBK * wg >= T ? num_qt : (k0 + kBK * wg) / BQ;
  if constexpr (kWS) {
    if (threadIdx.x == 0) {
      mbarrier_init(kv_full, kWarp);
      for (int s = 0; s < kStages; ++s) {
        mbarrier_init(&full[s], 2 * kWarp);  // each producer lane: its copies landing, and its lse and D stored
        mbarrier_init(&empty[s], 4 * kWG);   // one arrival per consumer warp
      }
    }
    __syncthreads();  // the barriers initialised before anyone uses them; no block-wide barrier follows
    if (warp < 0) {   // the producer warpgroup
      setmaxnreg_dec<ws_load_regs(kWG)>();
      if (warp != -4) return;
      for (int c = 0; c < kWG; ++c) {
        producer_copy<kBK>(sk + c * kKVSlot, q + C, C3, k0 + kBK * c, T, lane);
        producer_copy<kBK>(sv + c * kKVSlot, q + 2 * C, C3, k0 + kBK * c, T, lane);
      }
      cp_async_mbarrier_arrive_noinc(kv_full);
      for (int qt = qt0; qt < num_qt; ++qt) {
        const int i = qt - qt0, s = i % kStages;
        if (i >= kStages) mbarrier_wait(&empty[s], (i / kStages - 1) & 1);  // tile i - kStages released
        producer_copy<BQ>(stage_q(s), q, C3, qt * BQ, T, lane);
        producer_copy<BQ>(stage_do(s), dO, C, qt * BQ, T, lane);
        cp_async_mbarrier_arrive_noinc(&full[s]);
        for (int r = lane; r < BQ; r += kWarp) {  // QueryRowStats' values
          const int t = qt * BQ + r;
          stage_lse(s)[r] = t < T ? lse_bh[t] * kLog2e : 0.0f;
          stage_dv(s)[r] = t < T ? dvec_bh[t] : 0.0f;
        }
        mbarrier_arrive(&full[s]);  // a release: the stores above before the consumers' loads
      }
      // Stay until the consumers released the last stages: every copy this warp issued has landed and been read.
      for (int i = max(num_qt - qt0 - kStages, 0); i < num_qt - qt0; ++i) {
        mbarrier_wait(&empty[i % kStages], (i / kStages) & 1);
      }
      return;
    }
    setmaxnreg_inc<ws_mma_regs(kWG)>();
    mbarrier_wait(kv_full, 0);
    fence_proxy_async();  // the landed K and V, seen by the products
  } else {
    copy_tile_sw128<kKeys, kNT>(sk, q + C, C3, k0, T);
    copy_tile_sw128<kKeys, kNT>(sv, q + 2 * C, C3, k0, T);
    fetch_tiles(qt0, 0);
    cp_async_commit();
    load_rows(qt0);
    store_rows_to(0);
  }

  const int kw = k0 + 16 * warp;  // this warp's first key
  float dk[32], dv[32];           // the warp's 16 keys x 64 channels (wgmma's accumulator layout)
#pragma unroll
  for (int i = 0; i < 32; ++i) dk[i] = 0.0f, dv[i] = 0.0f;
  const uint64_t k_desc = kmajor_desc(smem_u32(sk + wg * kKVSlot)), v_desc = kmajor_desc(smem_u32(sv + wg * kKVSlot));
  uint32_t ka[kKVRegs ? kD / 16 : 1][4], va[kKVRegs ? kD / 16 : 1][4];  // kKVRegs: K, V as A fragments per k-step

  for (int qt = qt0; qt < num_qt; ++qt) {
    const int q0 = qt * BQ, s = kWS ? (qt - qt0) % kStages : (qt - qt0) & 1;
    if constexpr (kWS) {
      mbarrier_wait(&full[s], ((qt - qt0) / kStages) & 1);
      fence_proxy_async();  // the landed copies (generic proxy), seen by this thread's products (async proxy)
    } else {
      if (qt + 1 < num_qt) {  // stage s ^ 1 was last read in the previous iteration, which ended with a barrier
        fetch_tiles(qt + 1, s ^ 1);
        cp_async_commit();
        load_rows(qt + 1);  // stored into stage s ^ 1 at the end of this iteration
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      fence_proxy_async();  // this thread's copies, visible to the tensor cores' reads
      __syncthreads();      // every thread's copies of this tile (and of K, V) have landed
    }
    // Warpgroup-uniform: a tile whose every query precedes the warpgroup's keys is skipped (both barriers, or with
    // kWS the stage's wait and release, are every thread's, outside the branch).
    if (kWG == 1 || qt >= qt_wg) {
      const uint32_t q_addr = smem_u32(stage_q(s)), do_addr = smem_u32(stage_do(s));
      // Q and dO as S^T's and dP^T's B (K-major), and as dK's and dV's (MN-major).
      const uint64_t q_kdesc = kmajor_desc(q_addr), do_kdesc = kmajor_desc(do_addr);
      const uint64_t q_mdesc = mnmajor_desc(q_addr), do_mdesc = mnmajor_desc(do_addr);

      float st[BQ / 2], dpt[BQ / 2];  // S^T, dP^T: [4 n + e] = key row g + 8 (e / 2), query column 8 n + 2 tq + e % 2
      if constexpr (kKVRegs) {
        if (qt == qt_wg) {  // K and V landed with the first tile (the barrier above; kWS: kv_full's wait)
          load_a_sw128(ka, sk + wg * kKVSlot, warp % 4, lane);
          load_a_sw128(va, sv + wg * kKVSlot, warp % 4, lane);
        }
        fence_operands(ka);
        fence_operands(va);
      }
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        if constexpr (kKVRegs) {
          wgmma_rs<BQ, 0>(st, ka[kk], desc_advance(q_kdesc, 32 * kk), kk > 0);
        } else {
          wgmma_ss<BQ>(st, desc_advance(k_desc, 32 * kk), desc_advance(q_kdesc, 32 * kk), kk > 0);
        }
      }
      if constexpr (kOverlap) wgmma_commit();  // S^T's own group: P^T's element-wise work overlaps dP^T's products
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        if constexpr (kKVRegs) {
          wgmma_rs<BQ, 0>(dpt, va[kk], desc_advance(do_kdesc, 32 * kk), kk > 0);
        } else {
          wgmma_ss<BQ>(dpt, desc_advance(v_desc, 32 * kk), desc_advance(do_kdesc, 32 * kk), kk > 0);
        }
      }
      wgmma_commit();
      if constexpr (kOverlap) {
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
        fence_operands(dpt);
      }
      fence_operands(st);

      const float* slse = stage_lse(s);
      const float* sdv = stage_dv(s);
      uint32_t pa[NC][4], dsa[NC][4];
      // P^T into st and (kWithDs) dS^T (not yet times scale) into dpt. kMasked: the causal mask and the padded
      // queries (and keys); without it (every query of the tile real and at or after the warp's every key) no test per
      // element.
      auto scores = [&](auto masked, auto with_ds) {
        constexpr bool kMasked = decltype(masked)::value, kWithDs = decltype(with_ds)::value;
#pragma unroll
        for (int n = 0; n < BQ / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = g + 8 * (e >> 1), col = n * 8 + 2 * tq + (e & 1);
            const int t = q0 + col, t2 = kw + r;
            const bool visible = !kMasked || (t < T && t2 <= t);
            const float p = visible ? exp2_ftz(st[4 * n + e] * scale_log2 - slse[col]) : 0.0f;
            st[4 * n + e] = p;
            if constexpr (kWithDs) dpt[4 * n + e] = p * (dpt[4 * n + e] - sdv[col]);
          }
        }
      };
      const bool unmasked = kw + 15 <= q0 && q0 + BQ <= T;
      auto pack_p = [&] {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
#pragma unroll
          for (int r = 0; r < 4; ++r) pa[c][r] = pack_bf16x2(st[8 * c + 2 * r], st[8 * c + 2 * r + 1]);
        }
      };
      auto pack_store_ds = [&] {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
#pragma unroll
          for (int r = 0; r < 4; ++r) dsa[c][r] = pack_bf16x2(dpt[8 * c + 2 * r], dpt[8 * c + 2 * r + 1]);
          // The A fragment's layout: {row g, g + 8} x {columns 2 tq, 8 + 2 tq}, pairs.
          if constexpr (kStageDs) {
            unsigned char* row = ds_stage + g * Cfg::kDsLd + 2 * (c * 16 + 2 * tq);
            *reinterpret_cast<uint32_t*>(row) = dsa[c][0];
            *reinterpret_cast<uint32_t*>(row + 8 * Cfg::kDsLd) = dsa[c][1];
            *reinterpret_cast<uint32_t*>(row + 16) = dsa[c][2];
            *reinterpret_cast<uint32_t*>(row + 8 * Cfg::kDsLd + 16) = dsa[c][3];
          } else {
            bf16* row = ds + (static_cast<int64_t>(bh) * ds_ld + kw + g) * ds_ld + q0 + c * 16 + 2 * tq;
            *reinterpret_cast<uint32_t*>(row) = dsa[c][0];
            *reinterpret_cast<uint32_t*>(row + 8 * ds_ld) = dsa[c][1];
            *reinterpret_cast<uint32_t*>(row + 8) = dsa[c][2];
            *reinterpret_cast<uint32_t*>(row + 8 * ds_ld + 8) = dsa[c][3];
          }
        }
        if constexpr (kStageDs) {
          // The warp's rows back out, 16 bytes a thread: kPieces per row, kRowsAt rows per store. The staging rows
          // are rewritten next after the loop's closing barrier (kWS: the __syncwarp before the stage's release).
          constexpr int kPieces = 2 * BQ / 16, kRowsAt = kWarp / kPieces;
          __syncwarp();
#pragma unroll
          for (int i = 0; i < 16 / kRowsAt; ++i) {
            const int r = i * kRowsAt + lane / kPieces, piece = lane % kPieces;
            // ds's rows are T rounded up to 64 long: at 128 queries per step the last tile's second half may lie past
            // them (all masked: nothing to store).
            if (BQ <= 64 || q0 + 8 * piece < ds_ld) {
              *reinterpret_cast<uint4*>(ds + (static_cast<int64_t>(bh) * ds_ld + kw + r) * ds_ld + q0 + 8 * piece) =
                  *reinterpret_cast<const uint4*>(ds_stage + r * Cfg::kDsLd + 16 * piece);
            }
          }
        }
      };
      auto issue_dv = [&] {
#pragma unroll
        for (int c = 0; c < NC; ++c) wgmma_rs_mn(dv, pa[c], desc_advance(do_mdesc, 2048 * c), true);
      };
      auto issue_dk = [&] {
#pragma unroll
        for (int c = 0; c < NC; ++c) wgmma_rs_mn(dk, dsa[c], desc_advance(q_mdesc, 2048 * c), true);
      };
      if constexpr (kOverlap) {
        // P^T (dP^T's products still running), then dV += P^T dO issued; dS^T once dP^T's group retires (the
        // masked elements have P = 0 already, so no mask), then dK += dS^T Q: the same values as below.
        with_mask<true>(unmasked, [&](auto masked) { scores(masked, std::false_type{}); });
        pack_p();
        fence_operands(dv);
        fence_operands(pa);
        wgmma_fence();
        issue_dv();
        wgmma_commit();
        wgmma_wait<1>();  // dP^T's group (dV's may still run)
        fence_operands(dpt);
#pragma unroll
        for (int n = 0; n < BQ / 8; ++n) {
#pragma unroll
          for (int e = 0; e < 4; ++e) dpt[4 * n + e] = st[4 * n + e] * (dpt[4 * n + e] - sdv[n * 8 + 2 * tq + (e & 1)]);
        }
        pack_store_ds();
        fence_operands(dk);
        fence_operands(dsa);
        wgmma_fence();
        issue_dk();
      } else {
        with_mask<true>(unmasked, [&](auto masked) { scores(masked, std::true_type{}); });
        pack_p();
        pack_store_ds();
        fence_operands(dv);  // pa, dsa written by this thread: ordered before the products read them
        fence_operands(dk);
        fence_operands(pa);
        fence_operands(dsa);
        wgmma_fence();
        issue_dv();
        issue_dk();
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dv);
      fence_operands(dk);
    }
    if constexpr (kWS) {
      __syncwarp();  // the warp's products reading stage s retired, its dS^T staging rows read back
      if (lane == 0) mbarrier_arrive(&empty[s]);
    } else {
      if (qt + 1 < num_qt) store_rows_to(s ^ 1);  // published by the barrier below
      __syncthreads();  // everyone is done with stage s (and, after the last tile, with K and V)
    }
  }
  // kWS: the staging rows below overlay the warpgroup's K slot, which its other warps' products read.
  if constexpr (kWS) named_barrier_sync(1 + wg, kThreads);

  if (kw >= T) return;  // warp-uniform; no barrier follows
  // The K and V tiles are dead: the warp's 16 staging rows (of kStageLd) lie there, 2304 bytes per warp (kWS: its
  // warpgroup's K slot).
  auto* staging = reinterpret_cast<bf16*>(sk) + warp * 16 * kStageLd;
  auto store = [&](const float(&x)[32], bf16* dst, float mul) {
    float acc[1][kD / 8][4];
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[0][n][e] = x[4 * n + e];
    }
    store_rows<1, kD, kStageLd>(dst, C3, acc, mul, staging, kw, T, lane);
  };
  bf16* dk_out = dqkv + qkv_off + C;
  // bias_partial (or null): the warp's 16 keys' column sums of dK and dV as stored, in their row of the partials.
  float* sums = bias_partial != nullptr
                    ? bias_partial + (static_cast<int64_t>(b) * ((T + 15) / 16) + kw / 16) * C3 + C + h * kD
                    : nullptr;
  store(dk, dk_out, scale);
  if (sums != nullptr) stored_column_sums<kStageLd>(sums, staging, kw, T, lane);
  store(dv, dk_out + C, 1.0f);
  if (sums != nullptr) stored_column_sums<kStageLd>(sums + C, staging, kw, T, lane);
}

// dQ for one 64-query tile of one (b, h) from the kept dS^T, as attention_mma_backward.cu's attention_backward_q_ds
// on wgmma: dQ += dS K over the key tiles up to the diagonal, m64n64k16 with A = dS from the dS^T tile (keys x
// queries: MN-major A) and B = the K tile (MN-major), both from shared memory. kWG warpgroups per block
// (GPT_ATTENTION_WGMMA_WG2 dq: 2), each with its own 64 queries and dS^T tiles, sharing the K tiles; a warpgroup
// skips the key tiles past its last query (the block's last one at 2).
template <int kWG>
__global__ void __launch_bounds__((kThreads * kWG))
    attention_backward_q_wgmma_kernel(bf16* dqkv, const bf16* qkv, const bf16* ds, int64_t ds_ld, int T, int C, int NH,
                                      float scale, float* bias_partial, int sections) {
  constexpr int kNT = kThreads * kWG, kRows = kBQ * kWG;  // the block's threads and queries
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  auto stage_ds = [&](int s) { return base + s * (kWG + 1) * kTile; };  // kWG tiles, one per warpgroup
  auto stage_k = [&](int s) { return stage_ds(s) + kWG * kTile; };
  // warp: the block's (16 queries each, warpgroup after warpgroup); wg: this warp's warpgroup
  const int warp = threadIdx.x / kWarp, wg = kWG > 1 ? warp / 4 : 0, lane = threadIdx.x % kWarp;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * kRows;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const int64_t qkv_off = static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * kD;
  const bf16* k = qkv + qkv_off + C;
  const bf16* ds_bh = ds + static_cast<int64_t>(bh) * ds_ld * ds_ld + q0;  // column q0 of row 0
  const int num_kt = (min(q0 + kRows, T) - 1) / kBK + 1;  // key tiles up to the last real query of this block
  const int qg = q0 + kBQ * wg;                           // this warpgroup's first query, and its key tiles
  const int num_kt_wg = qg < T ? (min(qg + kBQ, T) - 1) / kBK + 1 : 0;
  // Key tile kt's dS^T rows into stage s (warpgroup w's 64 columns into its tile), zero-filled where the dK/dV kernel
  // may not have written: the diagonal tile's 16 x 16 blocks above the diagonal, the columns of queries past T (at
  // 32 queries per step it writes up to T rounded up to 32, not to 64; a piece of 8 columns that starts below T ends
  // within what it wrote), and a tile past a warpgroup's queries (which it skips). Only rows of queries past T would
  // read them, and those are never stored: the fill keeps this kernel to what was written (poisoned scratch in the
  // emulator; compute-sanitizer's initcheck on a GPU).
  auto fetch = [&](int kt, int s) {
    const int k0 = kt * kBK;
    for (int i = threadIdx.x; i < kWG * 64 * 8; i += kNT) {
      const int w = i / (64 * 8), r = i / 8 % 64, c = (i % 8) * 8, qw0 = q0 + kBQ * w;
      const bool skip = k0 > qw0 || (k0 == qw0 && r / 16 > c / 16) || qw0 + c >= T;
      cp_async_16(stage_ds(s) + w * kTile + sw128_offset(r, c), ds_bh + (skip ? 0 : (k0 + r) * ds_ld + kBQ * w + c),
                  skip ? 0u : 16u);
    }
    copy_tile_sw128<kBK, kNT>(stage_k(s), k, C3, k0, T);
  };
  fetch(0, 0);
  cp_async_commit();

  const int qw = q0 + 16 * warp;  // this warp's first query
  float dq[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) dq[i] = 0.0f;
  for (int kt = 0; kt < num_kt; ++kt) {
    const int s = kt & 1;
    if (kt + 1 < num_kt) {  // stage s ^ 1 was last read in iteration kt - 1, which ended with a barrier
      fetch(kt + 1, s ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();  // this thread's copies, visible to the tensor cores' reads
    __syncthreads();      // every thread's copies of tile kt have landed
    // Warpgroup-uniform: a tile whose every key follows the warpgroup's queries is skipped (both barriers are every
    // thread's, outside the branch).
    if (kWG == 1 || kt < num_kt_wg) {
      const uint64_t ds_desc = mnmajor_desc(smem_u32(stage_ds(s) + wg * kTile));
      const uint64_t k_desc = mnmajor_desc(smem_u32(stage_k(s)));
      fence_operands(dq);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        wgmma_ss<64, 1, 1>(dq, desc_advance(ds_desc, 2048 * kk), desc_advance(k_desc, 2048 * kk), true);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dq);
    }
    __syncthreads();  // everyone is done with stage s before iteration kt + 1 refills it
  }

  if (qw >= T) return;  // warp-uniform; no barrier follows
  float acc[1][kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[0][n][e] = dq[4 * n + e];
  }
  // Every tile is dead after the loop's last barrier: the warp's 16 staging rows (of kStageLd) lie in stage 0.
  bf16* staging = reinterpret_cast<bf16*>(base) + warp * 16 * kStageLd;
  store_rows<1, kD, kStageLd>(dqkv + qkv_off, C3, acc, scale, staging, qw, T, lane);
  if (bias_partial != nullptr) {  // the warp's 16 queries' column sums of dQ as stored, in their row of the partials
    stored_column_sums<kStageLd>(bias_partial + (static_cast<int64_t>(b) * ((T + 15) / 16) + qw / 16) * C3 + h * kD,
                                 staging, qw, T, lane);
  }
}

// The bias partials' sums, in two passes of this kernel (a fixed order: the same bits every run). Block (x, g) takes
// columns 32 x.. and the g-th of gridDim.y groups of consecutive rows of partial (rows apart by OC): thread (x, y)
// adds the group's rows y, y + kSumRows, ... in order, then row 0 adds the kSumRows sums in order into out[g * OC +
// oc] (`add`: +=, else =). Pass 1 writes each group's sums after the partials' rows; pass 2 (one group) adds those
// into the gradient. One pass over 4096 rows (batch 64) was 72 blocks, each thread a chain of 256 loads.
constexpr int kSumRows = 16;
__global__ void __launch_bounds__(kWarp* kSumRows)
    bias_partials_sum_kernel(float* out, const float* partial, int64_t rows, int OC, bool add) {
  __shared__ float sums[kSumRows][kWarp];
  const int oc = blockIdx.x * kWarp + threadIdx.x;
  const int64_t per = (rows + gridDim.y - 1) / gridDim.y, lo = static_cast<int64_t>(blockIdx.y) * per,
                hi = min(rows, lo + per);
  float s = 0.0f;
  if (oc < OC) {
    for (int64_t r = lo + threadIdx.y; r < hi; r += kSumRows) s += partial[r * OC + oc];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || oc >= OC) return;
  float total = 0.0f;
  for (int r = 0; r < kSumRows; ++r) total += sums[r][threadIdx.x];
  float* dst = out + static_cast<int64_t>(blockIdx.y) * OC + oc;
  *dst = add ? *dst + total : total;
}

template <int BQ, int kWG, bool kWS = false>
void backward_kv_launch(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dvec, int B,
                        int T, int C, int NH, bf16* ds, int64_t ds_ld, float* bias_partial, cudaStream_t stream) {
  const size_t smem = kWS ? BwdKvWgmmaCfg<BQ>::ws_bytes(kWG) : BwdKvWgmmaCfg<BQ>::bytes(kWG);
  const int threads = kThreads * (kWG + (kWS ? 1 : 0));
  decltype(&attention_backward_kv_wgmma_kernel<32, false, 1>) kernel = nullptr;  // every form has this type
  if constexpr (BQ == 128) {
    // Warp-specialised at 2 (240 registers a consumer thread): plain (ptxas: no spills) or overlapped (4 bytes of
    // spills); with K and V in registers too it spilled 280, so RS is ignored here.
    kernel = overlap_enabled("bwd") ? attention_backward_kv_wgmma_kernel<128, true, 2, false, true, true>
                                    : attention_backward_kv_wgmma_kernel<128, false, 2, false, true, true>;
    check_ws_registers(kernel, threads);
  } else if constexpr (kWS && kWG == 3) {
    // In a consumer's 160 registers K and V stay in shared memory, and the overlap fits at 32 queries per step alone
    // (ptxas: the others spill, and serialise the products at 64); RS and OVERLAP at 64 are ignored here.
    constexpr bool kOverlapFits = BQ == 32;
    kernel = kOverlapFits && overlap_enabled("bwd")
                 ? attention_backward_kv_wgmma_kernel<BQ, kOverlapFits, 3, false, true, true>
                 : attention_backward_kv_wgmma_kernel<BQ, false, 3, false, true, true>;
    check_ws_registers(kernel, threads);
  } else if constexpr (kWS) {
    kernel = overlap_enabled("bwd")    ? attention_backward_kv_wgmma_kernel<BQ, true, kWG, false, true, true>
             : registers_enabled("kv") ? attention_backward_kv_wgmma_kernel<BQ, false, kWG, true, true, true>
                                       : attention_backward_kv_wgmma_kernel<BQ, false, kWG, false, true, true>;
    check_ws_registers(kernel, threads);
  } else {
    kernel = overlap_enabled("bwd") ? attention_backward_kv_wgmma_kernel<BQ, true, kWG>
                                    : attention_backward_kv_wgmma_kernel<BQ, false, kWG>;
    if constexpr (kWG == 1) {
      if (!overlap_enabled("bwd") && registers_enabled("kv")) {
        kernel = attention_backward_kv_wgmma_kernel<BQ, false, 1, true>;
      } else if (!overlap_enabled("bwd") && env_is("GPT_ATTENTION_WGMMA_DS_STAGE", "0")) {
        kernel = attention_backward_kv_wgmma_kernel<BQ, false, 1, false, false>;
      }
    }
  }
  set_smem(kernel, smem);
  prefer_shared_memory(kernel);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kBK * kWG)), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD)), scale_log2 = scale * kLog2e;
  kernel<<<grid, threads, smem, stream>>>(dqkv, dout, qkv, lse, dvec, T, C, NH, scale, scale_log2, ds, ds_ld,
                                          bias_partial, attention_sections(B * NH, T, kD, sizeof(bf16)));
  GPT_CUDA_CHECK_LAUNCH();
}

template <int BQ>
void backward_kv_launch(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dvec, int B,
                        int T, int C, int NH, bf16* ds, int64_t ds_ld, float* bias_partial, cudaStream_t stream) {
  if (env_is("GPT_ATTENTION_WGMMA_WS_KV", "2")) {
    backward_kv_launch<BQ, 2, true>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, bias_partial, stream);
  } else if (env_is("GPT_ATTENTION_WGMMA_WS_KV", "3")) {
    backward_kv_launch<BQ, 3, true>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, bias_partial, stream);
  } else if (two_warpgroups("kv")) {
    backward_kv_launch<BQ, 2>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, bias_partial, stream);
  } else {
    backward_kv_launch<BQ, 1>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, bias_partial, stream);
  }
}

template <int kWG>
void backward_q_launch(bf16* dqkv, const bf16* qkv, const bf16* ds, int64_t ds_ld, int B, int T, int C, int NH,
                       float* bias_partial, cudaStream_t stream) {
  constexpr size_t smem = dq_smem(kWG);
  const auto kernel = attention_backward_q_wgmma_kernel<kWG>;
  set_smem(kernel, smem);
  prefer_shared_memory(kernel);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kBQ * kWG)), static_cast<unsigned>(B * NH));
  const float scale = 1.0f / std::sqrt(static_cast<float>(kD));
  kernel<<<grid, kThreads * kWG, smem, stream>>>(dqkv, qkv, ds, ds_ld, T, C, NH, scale, bias_partial,
                                                 attention_sections(B * NH, T, kD, sizeof(bf16)));
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void attention_backward_wgmma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dvec, int B,
                              int T, int C, int NH, bf16* ds, int64_t ds_ld, float* dqkv_bias, float* bias_partials,
                              cudaStream_t stream) {
  GPT_CHECK(attention_wgmma_backward_usable(C, NH, false));
  GPT_CHECK(B >= 0 && T >= 0 && static_cast<int64_t>(B) * NH <= 65535 && ds_ld >= ceil_div(T, 64) * 64);
  GPT_CHECK(ds != nullptr && aligned16(ds) && aligned16(dqkv) && aligned16(dout) && aligned16(qkv));
  GPT_CHECK(dqkv_bias == nullptr || (bias_partials != nullptr && reinterpret_cast<uintptr_t>(bias_partials) % 8 == 0));
  if (B == 0 || T == 0) return;
  float* partial = dqkv_bias != nullptr ? bias_partials : nullptr;
  if (env_is("GPT_ATTENTION_WGMMA_BQ", "128")) {  // the warp-specialised kernel at 2 consumers, whatever WS_KV says
    backward_kv_launch<128, 2, true>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, partial, stream);
  } else if (env_is("GPT_ATTENTION_WGMMA_BQ", "64")) {
    backward_kv_launch<64>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, partial, stream);
  } else {
    backward_kv_launch<32>(dqkv, dout, qkv, lse, dvec, B, T, C, NH, ds, ds_ld, partial, stream);
  }
  if (two_warpgroups("dq")) {
    backward_q_launch<2>(dqkv, qkv, ds, ds_ld, B, T, C, NH, partial, stream);
  } else {
    backward_q_launch<1>(dqkv, qkv, ds, ds_ld, B, T, C, NH, partial, stream);
  }
  if (dqkv_bias != nullptr) {
    const int OC = 3 * C;
    const int64_t chunks = cuda_workspace::attention_bias_chunks(B, T);
    const int groups = static_cast<int>(std::min<int64_t>(cuda_workspace::kAttentionBiasGroups, chunks));
    float* group_sums = partial + chunks * OC;
    const unsigned col_blocks = static_cast<unsigned>(ceil_div(OC, kWarp));
    bias_partials_sum_kernel<<<dim3(col_blocks, static_cast<unsigned>(groups)), dim3(kWarp, kSumRows), 0, stream>>>(
        group_sums, partial, chunks, OC, false);
    GPT_CUDA_CHECK_LAUNCH();
    bias_partials_sum_kernel<<<dim3(col_blocks, 1), dim3(kWarp, kSumRows), 0, stream>>>(dqkv_bias, group_sums, groups,
                                                                                        OC, true);
    GPT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace gpt::cuda
