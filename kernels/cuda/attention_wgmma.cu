// The wgmma attention kernels (attention_wgmma.h). Read attention_mma.cu and attention_mma_backward.cu first: these
// are their kernels at head size 64 without dropout, with the products on the warpgroup instruction (wgmma_ptx.cuh)
// instead of ldmatrix + mma.sync per warp. The forward (64 query rows per block, 16 per warp, K and V tiles of 64
// keys double-buffered by cp.async, the online softmax in registers):
//  - The block's 4 warps are one warpgroup. S = Q K^T is 4 wgmma m64n64k16 (k = 16 channels each) with Q and K
//    read by the tensor cores from shared memory; warp w receives rows 16 w.. of S in the layout of the mma.sync
//    kernel's eight m16n8 accumulator tiles, so the softmax code is that kernel's, unchanged in its math but for
//    exp2 (exp2_ftz, wgmma_ptx.cuh: one MUFU.EX2, probabilities under 2^-126 flushed to 0; in the backward too).
//  - O += P V is 4 wgmma (k = 16 keys each) with P from registers (the packed S, as in the mma.sync kernel) and V
//    from shared memory, MN-major.
//  - The tiles are 128-byte rows with the 128-byte swizzle (no padding; sw128_offset), 1024-byte aligned, each
//    copied by cp.async and made visible to the tensor cores by fence_proxy_async before the barrier.
//  - Every warp computes every key tile up to the block's last row (wgmma is a warpgroup instruction: no warp may
//    skip it); the tile on the diagonal is masked per element, as the mma.sync kernel masks its diagonal chunks.
// The backward (where it keeps dS^T): the dK/dV kernel and the dQ kernel over the kept dS^T, likewise
// (attention_wgmma_backward.cu; attention_wgmma.cuh holds what both files share). Each batch of products is waited for
// at once, but in the overlapped variants (GPT_ATTENTION_WGMMA_OVERLAP), which compute the element-wise work while the
// next batch runs.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace gpt::cuda {

namespace {

using namespace attention_wgmma_detail;

// kWG warpgroups per block (GPT_ATTENTION_WGMMA_WG2: 2), each with its own 64 query rows, sharing the K and V tiles
// (half the copies per product at 2); a warpgroup skips the key tiles past its last row (the block's last one at 2).
// kNK keys per K/V tile (GPT_ATTENTION_WGMMA_BK: 64, or 128 as cuDNN's forward takes: half the barriers, waits, O
// rescales and row reductions per key; S as two m64n64 products per k-step). kMinBlocks: __launch_bounds__'s blocks
// per SM (0: none). The default kernel (one warpgroup, 64 keys) takes 5, which ptxas meets in 96 registers without
// spills (107 unbounded: 4 blocks); its 41 KB of shared memory let 5 in; GPT_ATTENTION_WGMMA_FWD_BLOCKS=4 takes the
// unbounded one (not yet measured on a GPU either way). kQRegs (GPT_ATTENTION_WGMMA_RS fwd): S's A, the warpgroup's Q
// rows, from registers (load_a_sw128 once, at the first tile) instead of from shared memory at every product.
template <int kWG, int kNK, int kMinBlocks, bool kQRegs = false>
__global__ void __launch_bounds__((kThreads * kWG), kMinBlocks)
    attention_forward_wgmma_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH, float scale_log2,
                                   int sections) {
  constexpr int kNT = kThreads * kWG, kRows = kBQ * kWG;  // the block's threads and query rows
  constexpr int kParts = kNK / 64;                        // 64-key parts of a K/V tile
  static_assert(kNK == 64 || kNK == 128);
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  unsigned char* sq = base;  // kWG tiles of 64 rows
  auto stage_k = [&](int s) { return base + (kWG + 2 * kParts * s) * kTile; };
  auto stage_v = [&](int s) { return base + (kWG + kParts * (2 * s + 1)) * kTile; };
  // warp: the block's (16 rows each, warpgroup after warpgroup); wg: this warp's warpgroup
  const int warp = threadIdx.x / kWarp, wg = kWG > 1 ? warp / 4 : 0, lane = threadIdx.x % kWarp, g = lane >> 2,
            tq = lane & 3;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * kRows;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const bf16* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * kD;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const int num_kt = (min(q0 + kRows, T) - 1) / kNK + 1;  // key tiles up to the last real query of this block
  const int qg = q0 + kBQ * wg;                           // this warpgroup's first row, and its key tiles
  const int num_kt_wg = qg < T ? (min(qg + kBQ, T) - 1) / kNK + 1 : 0;

  copy_tile_sw128<kRows, kNT>(sq, q, C3, q0, T);
  copy_tile_sw128<kNK, kNT>(stage_k(0), k, C3, 0, T);
  copy_tile_sw128<kNK, kNT>(stage_v(0), v, C3, 0, T);
  cp_async_commit();

  const int qw = q0 + 16 * warp;  // this warp's first row
  float o[32];                    // O: the warp's 16 rows x 64 channels (wgmma's accumulator layout)
  float m[2], l[2];               // rows g, g + 8: running max (log2 units) and this lane's partial sum
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.0f;
  const uint64_t q_desc = kmajor_desc(smem_u32(sq + wg * kTile));
  uint32_t qa[kQRegs ? kD / 16 : 1][4];  // kQRegs: Q as S's A fragments, one per k-step

  for (int kt = 0; kt < num_kt; ++kt) {
    const int k0 = kt * kNK, s = kt & 1;
    if (kt + 1 < num_kt) {  // stage s ^ 1 was last read in iteration kt - 1, which ended with a barrier
      copy_tile_sw128<kNK, kNT>(stage_k(s ^ 1), k, C3, k0 + kNK, T);
      copy_tile_sw128<kNK, kNT>(stage_v(s ^ 1), v, C3, k0 + kNK, T);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async();  // this thread's copies, visible to the tensor cores' reads
    __syncthreads();      // every thread's copies of tile kt (and of Q) have landed
    // Warpgroup-uniform: a tile whose every key follows the warpgroup's rows is skipped (its products and
    // softmax; both barriers are every thread's, outside the branch).
    if (kWG == 1 || kt < num_kt_wg) {
      const uint64_t k_desc = kmajor_desc(smem_u32(stage_k(s))), v_desc = mnmajor_desc(smem_u32(stage_v(s)));

      // S: the warp's 16 rows x kNK keys; sc[4 n + 2 hf + e] = row g + 8 hf, key k0 + 8 n + 2 tq + e; part j of 64
      // keys in sc[32 j..] (the layout of one m64n64 product). Every part is computed, also one whose keys all follow
      // the warpgroup's rows (the mask zeroes its P): a wgmma under a branch makes ptxas serialise them (C7520).
      float sc[kNK / 2];
      if constexpr (kQRegs) {
        if (kt == 0) load_a_sw128(qa, sq + wg * kTile, warp % 4, lane);  // Q landed with tile 0 (the barrier above)
        fence_operands(qa);
      }
      wgmma_fence();
      issue_scores<kParts, kQRegs>(sc, qa, q_desc, k_desc);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(sc);

      uint32_t pa[kNK / 16][4];
      float alpha[2];
      with_mask<true>(k0 + kNK - 1 <= qw, [&](auto masked) {
        online_softmax<decltype(masked)::value>(sc, m, l, alpha, k0, qw, g, tq, scale_log2);
        rescale_rows(o, alpha);
        pack_p(pa, sc);
      });

      fence_operands(o);  // o rescaled and pa written by this thread: ordered before the products read them
      fence_operands(pa);
      wgmma_fence();
#pragma unroll
      for (int c = 0; c < kNK / 16; ++c) wgmma_rs_mn(o, pa[c], desc_advance(v_desc, 2048 * c), true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(o);
    }
    __syncthreads();  // everyone is done with stage s before iteration kt + 1 refills it
  }

  if (qw >= T) return;  // warp-uniform; no barrier follows
  // Every tile is dead after the loop's last barrier: the warp's 16 staging rows lie in the K/V stages, 2304 bytes
  // per warp.
  finish_forward(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * kD, lse, o, m, l,
                 reinterpret_cast<bf16*>(stage_k(0)) + warp * 16 * kStageLd, bh, qw, T, C, lane);
}

// The forward with its products overlapping the softmax (GPT_ATTENTION_WGMMA_OVERLAP=1 or fwd; an experiment not yet
// measured on a GPU), as FlashAttention-3 overlaps them within a warpgroup: iteration kt issues S = Q K_kt and the
// previous tile's O += P V, computes this tile's softmax while the latter runs, then rescales O. V takes three stages
// (V of tile kt - 1 is read while tile kt + 1 is copied), K two (tile kt - 1's S was retired in step kt - 1), with
// one barrier per tile: 49 KB, 4 blocks per SM. The same values as the kernel above: O is rescaled by a tile's alpha
// after the previous tile's P V and before its own, as there.
constexpr int kOverlapKStages = 2, kOverlapVStages = 3;
constexpr size_t kSmemOverlap = (1 + kOverlapKStages + kOverlapVStages) * size_t{kTile} + 1024;

__global__ void __launch_bounds__(kThreads)
    attention_forward_wgmma_overlap_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH,
                                           float scale_log2, int sections) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  unsigned char* sq = base;
  auto stage_k = [&](int kt) { return base + (1 + kt % kOverlapKStages) * kTile; };  // tile kt's
  auto stage_v = [&](int kt) { return base + (1 + kOverlapKStages + kt % kOverlapVStages) * kTile; };
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * kBQ;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const bf16* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * kD;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const int num_kt = (min(q0 + kBQ, T) - 1) / kBK + 1;  // key tiles up to the last real query of this tile
  auto fetch = [&](int kt) {                            // tile kt's K and V into their stages, one commit group
    copy_tile_sw128(stage_k(kt), k, C3, kt * kBK, T);
    copy_tile_sw128(stage_v(kt), v, C3, kt * kBK, T);
    cp_async_commit();
  };

  copy_tile_sw128(sq, q, C3, q0, T);
  fetch(0);  // with Q
  if (num_kt > 1) fetch(1);

  const int qw = q0 + 16 * warp;  // this warp's first row
  float o[32];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  const uint64_t q_desc = kmajor_desc(smem_u32(sq));
  auto issue_s = [&](float(&sc)[32], int kt) {
    const uint64_t k_desc = kmajor_desc(smem_u32(stage_k(kt)));
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      wgmma_ss<64>(sc, desc_advance(q_desc, 32 * kk), desc_advance(k_desc, 32 * kk), kk > 0);
    }
  };
  auto issue_pv = [&](const uint32_t(&pa)[kBK / 16][4], int kt) {
    const uint64_t v_desc = mnmajor_desc(smem_u32(stage_v(kt)));
#pragma unroll
    for (int c = 0; c < kBK / 16; ++c) wgmma_rs_mn(o, pa[c], desc_advance(v_desc, 2048 * c), true);
  };
  auto softmax = [&](float(&sc)[32], float(&alpha)[2], int kt) {
    with_mask<true>(kt * kBK + kBK - 1 <= qw, [&](auto masked) {
      online_softmax<decltype(masked)::value>(sc, m, l, alpha, kt * kBK, qw, g, tq, scale_log2);
    });
  };

  // Tile 0: S, its softmax (O is 0: no rescale).
  if (num_kt > 1) {
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  fence_proxy_async();
  __syncthreads();
  float sc[32], alpha[2];
  uint32_t pa[kBK / 16][4];
  wgmma_fence();
  issue_s(sc, 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(sc);
  softmax(sc, alpha, 0);
  pack_p(pa, sc);

  // Iteration kt: S of tile kt and P V of tile kt - 1 (P in `prev`), this tile's P into `next`. The two P arrays
  // alternate (two iterations per loop trip): a register copy between them inside the products' pipeline made ptxas
  // serialise the wgmmas.
  uint32_t pb[kBK / 16][4];
  auto step = [&](int kt, uint32_t(&prev)[kBK / 16][4], uint32_t(&next)[kBK / 16][4]) {
    cp_async_wait<0>();  // tile kt's copies (the only ones in flight)
    fence_proxy_async();
    __syncthreads();  // ... have landed for every thread, and every warp has retired tile kt - 2's P V and tile
    // kt - 1's S (step kt - 1). So V's stage (kt + 1) % 3, which held tile kt - 2, and K's (kt + 1) % 2, which held
    // tile kt - 1, are free: the next tile's copies run during this step.
    if (kt + 1 < num_kt) fetch(kt + 1);
    fence_operands(o);
    fence_operands(prev);  // its packing (a cvt) stays before the fence
    wgmma_fence();
    issue_s(sc, kt);
    wgmma_commit();
    issue_pv(prev, kt - 1);
    wgmma_commit();
    wgmma_wait<1>();  // S (the previous tile's P V may still run)
    fence_operands(sc);
    softmax(sc, alpha, kt);
    pack_p(next, sc);
    wgmma_wait<0>();  // P V of tile kt - 1: O is free
    fence_operands(o);
    rescale_rows(o, alpha);
  };
  for (int kt = 1; kt < num_kt; kt += 2) {
    step(kt, pa, pb);
    if (kt + 1 < num_kt) step(kt + 1, pb, pa);
  }
  auto last_pv = [&](uint32_t(&p)[kBK / 16][4]) {
    fence_operands(o);
    fence_operands(p);
    wgmma_fence();
    issue_pv(p, num_kt - 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
  };
  if ((num_kt - 1) % 2 == 1) {  // the last tile's P: pb after an odd iteration, pa after an even one (or none)
    last_pv(pb);
  } else {
    last_pv(pa);
  }
  __syncthreads();  // the last P V has read its V stage before any warp stages its output there

  if (qw >= T) return;  // warp-uniform; no barrier follows
  finish_forward(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * kD, lse, o, m, l,
                 reinterpret_cast<bf16*>(stage_k(0)) + warp * 16 * kStageLd, bh, qw, T, C, lane);
}

template <int kWG, int kNK, int kMinBlocks = 0, bool kQRegs = false>
void forward_launch(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, float scale_log2,
                    cudaStream_t stream) {
  constexpr size_t smem = forward_smem(kWG, kNK);
  const auto kernel = attention_forward_wgmma_kernel<kWG, kNK, kMinBlocks, kQRegs>;
  set_smem(kernel, smem);
  prefer_shared_memory(kernel);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kBQ * kWG)), static_cast<unsigned>(B * NH));
  kernel<<<grid, kThreads * kWG, smem, stream>>>(out, lse, qkv, T, C, NH, scale_log2,
                                                 attention_sections(B * NH, T, kD, sizeof(bf16)));
}

// Whether the current device is sm_90 (asked at each call: two attribute reads, no cache to go stale).
bool current_device_is_sm90() {
  int device = 0, major = 0, minor = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

}  // namespace

bool attention_wgmma_forward_usable(int C, int NH, bool dropout) {
  if (dropout || NH <= 0 || C % NH != 0 || C / NH != kD) return false;
  if (env_is("GPT_ATTENTION_WGMMA", "0")) return false;
  return current_device_is_sm90();
}

bool attention_wgmma_backward_usable(int C, int NH, bool dropout) {
  return attention_wgmma_forward_usable(C, NH, dropout) && !env_is("GPT_ATTENTION_WGMMA", "fwd");
}

size_t attention_wgmma_smem_bytes() {
  return std::max({forward_smem(2, 128), kSmemOverlap, BwdKvWgmmaCfg<64>::bytes(2), dq_smem(2)});
}

void attention_forward_wgmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream) {
  GPT_CHECK(attention_wgmma_forward_usable(C, NH, false));
  GPT_CHECK(B >= 0 && T >= 0 && static_cast<int64_t>(B) * NH <= 65535);
  if (B == 0 || T == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kBQ)), static_cast<unsigned>(B * NH));
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(kD));
  if (env_is("GPT_ATTENTION_WGMMA_WS", "2") || env_is("GPT_ATTENTION_WGMMA_WS", "3")) {
    forward_ws(env_is("GPT_ATTENTION_WGMMA_WS", "2") ? 2 : 3, out, lse, qkv, B, T, C, NH, scale_log2, stream);
  } else if (overlap_enabled("fwd")) {
    set_smem(attention_forward_wgmma_overlap_kernel, kSmemOverlap);
    prefer_shared_memory(attention_forward_wgmma_overlap_kernel);
    attention_forward_wgmma_overlap_kernel<<<grid, kThreads, kSmemOverlap, stream>>>(
        out, lse, qkv, T, C, NH, scale_log2, attention_sections(B * NH, T, kD, sizeof(bf16)));
  } else if (env_is("GPT_ATTENTION_WGMMA_BK", "128")) {
    if (two_warpgroups("fwd")) {
      forward_launch<2, 128>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
    } else {
      forward_launch<1, 128>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
    }
  } else if (two_warpgroups("fwd")) {
    forward_launch<2, kBK>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
  } else if (registers_enabled("fwd")) {
    forward_launch<1, kBK, 4, true>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
  } else if (env_is("GPT_ATTENTION_WGMMA_FWD_BLOCKS", "4")) {
    forward_launch<1, kBK>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
  } else {
    forward_launch<1, kBK, 5>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
