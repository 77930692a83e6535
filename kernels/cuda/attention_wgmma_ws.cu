// The warp-specialised wgmma forward (GPT_ATTENTION_WGMMA_WS=2 or 3; an experiment not yet run on a GPU), as
// FlashAttention-3 schedules its forward at head size 64. Read attention_wgmma.cu's opening comment first.
//  - The block is one producer warpgroup and kWG consumer warpgroups of 64 query rows each (128 or 192 rows per
//    block), one block per SM. The producer's first warp alone works: it copies the block's Q tiles, then every K/V
//    tile of 128 keys up to the block's last row into a ring of kWsStages stages, by cp.async, each stage's copies
//    signalled by their landing on the stage's `full` mbarrier (cp_async_mbarrier_arrive_noinc), and refills a stage
//    when every consumer warp has released it (its `empty` mbarrier). No consumer issues a copy or waits at a barrier
//    of the whole block: each waits for the stage it needs, and its loads run while it computes.
//  - setmaxnreg moves registers from the producer (kLoadRegs) to the consumers (kMmaRegs), as FA3 does. ptxas
//    allocates the code after each setmaxnreg within its count (240 at kWG 2, 160 at 3; a kernel whose consumers hold
//    200 live floats spills 532 bytes without the increase and none with it), though its -v line reports the launch
//    bound's share (168 at 384 threads, 128 at 512).
//  - At kWG 2 each consumer overlaps its products with its softmax, as attention_forward_wgmma_overlap_kernel does:
//    tile kt's S = Q K_kt is issued together with tile kt - 1's O += P V, the softmax of S runs while the latter
//    does, then O is rescaled and P packed into the registers the finished P V read (one P array, as FA3); and Q is
//    held in registers (S's A fragments, as GPT_ATTENTION_WGMMA_RS's forward). At kWG 3 a consumer takes one tile at
//    a time, as attention_forward_wgmma_kernel does, with Q from shared memory: in its 160 registers the overlap
//    spilled 56 bytes; three warpgroups per SM interleave their products and softmax instead.
//    Stage kt % kWsStages is released once tile kt's P V has retired (K and V share a stage): three stages, so that
//    with the overlap the producer refills one while the consumers read the other two.
//  - The values: attention_wgmma.cu's forward on key tiles of 128 (GPT_ATTENTION_WGMMA_BK=128) bit for bit: the same
//    products, in the same order, and the same online softmax; only their scheduling differs.
// A consumer warpgroup whose rows end before some of the block's key tiles still waits for each of them and releases
// it: an `empty` phase needs every consumer warp's arrival, and an arrival for a later use of the stage before the
// earlier one completed would count toward the wrong phase.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/attention_wgmma.cuh"
#include "kernels/cuda/attention_wgmma.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mbarrier_ptx.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace gpt::cuda {

namespace attention_wgmma_detail {

namespace {

// The shared memory at kWG consumer warpgroups: per consumer a Q slot (its 64-row Q tile, 8 KB, and after its last
// product its four warps' output staging rows, 16 x kStageLd bf16 each: 9216 bytes, a multiple of 1024), then
// kWsStages stages of a K and a V tile of kWsKeys rows, then the mbarriers (Q's, full[kWsStages], empty[kWsStages]),
// and 1 KB to align.
template <int kWG>
struct WsFwdCfg {
  static constexpr uint32_t kQSlot = kWsKVSlot;
  static constexpr uint32_t kKV = kWsKeys / 64 * kTile;  // one K (or V) tile
  static constexpr uint32_t kStage = 2 * kKV;
  static constexpr uint32_t kBars = kWG * kQSlot + kWsStages * kStage;
  static constexpr size_t kBytes = kBars + 8 * (1 + 2 * kWsStages) + 1024;
  // setmaxnreg: the producer's and each consumer's registers (attention_wgmma.cuh's ws_load_regs, ws_mma_regs).
  static constexpr int kLoadRegs = ws_load_regs(kWG), kMmaRegs = ws_mma_regs(kWG);
};

template <int kWG>
__global__ void __launch_bounds__((kThreads * (kWG + 1)), 1)
    attention_forward_wgmma_ws_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH, float scale_log2,
                                      int sections) {
  using Cfg = WsFwdCfg<kWG>;
  constexpr int kRows = kBQ * kWG, kParts = kWsKeys / 64, kS = kWsStages;
  constexpr bool kQRegs = kWG == 2, kOverlap = kWG == 2;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* base = align_1024(smem_raw);
  auto q_slot = [&](int c) { return base + c * Cfg::kQSlot; };
  auto stage_k = [&](int kt) { return base + kWG * Cfg::kQSlot + (kt % kS) * Cfg::kStage; };  // tile kt's
  auto stage_v = [&](int kt) { return stage_k(kt) + Cfg::kKV; };
  uint64_t* q_full = reinterpret_cast<uint64_t*>(base + Cfg::kBars);
  uint64_t* full = q_full + 1;  // [kt % kS]: tile kt's K and V have landed
  uint64_t* empty = full + kS;  // [kt % kS]: every consumer warp is done with tile kt
  const int warp = threadIdx.x / kWarp, wg = warp / 4, lane = threadIdx.x % kWarp;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * kRows;  // rank 0: the last query tile, with the most keys
  const int64_t C3 = 3 * static_cast<int64_t>(C);
  const bf16* q = qkv + static_cast<int64_t>(b) * T * C3 + static_cast<int64_t>(h) * kD;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const int num_kt = (min(q0 + kRows, T) - 1) / kWsKeys + 1;  // key tiles up to the block's last real query

  if (threadIdx.x == 0) {
    mbarrier_init(q_full, kWarp);
    for (int s = 0; s < kS; ++s) {
      mbarrier_init(&full[s], kWarp);     // the copying warp's 32 lanes, as their copies land
      mbarrier_init(&empty[s], 4 * kWG);  // one arrival per consumer warp
    }
  }
  __syncthreads();  // the barriers initialised before anyone uses them; no block-wide barrier follows

  if (wg == 0) {  // the producer
    setmaxnreg_dec<Cfg::kLoadRegs>();
    if (warp != 0) return;
#pragma unroll
    for (int c = 0; c < kWG; ++c) producer_copy<kBQ>(q_slot(c), q, C3, q0 + kBQ * c, T, lane);
    cp_async_mbarrier_arrive_noinc(q_full);
    for (int kt = 0; kt < num_kt; ++kt) {
      if (kt >= kS) mbarrier_wait(&empty[kt % kS], (kt / kS - 1) & 1);  // tile kt - kS released
      producer_copy<kWsKeys>(stage_k(kt), k, C3, kt * kWsKeys, T, lane);
      producer_copy<kWsKeys>(stage_v(kt), v, C3, kt * kWsKeys, T, lane);
      cp_async_mbarrier_arrive_noinc(&full[kt % kS]);
    }
    // Stay until the consumers released the last stages: every copy this warp issued has landed and been read.
    for (int kt = max(num_kt - kS, 0); kt < num_kt; ++kt) mbarrier_wait(&empty[kt % kS], (kt / kS) & 1);
    return;
  }

  setmaxnreg_inc<Cfg::kMmaRegs>();
  const int c = wg - 1, w = warp % 4, g = lane >> 2, tq = lane & 3;
  const int qg = q0 + kBQ * c, qw = qg + 16 * w;  // the warpgroup's and the warp's first rows
  const int num_kt_wg = qg < T ? (min(qg + kBQ, T) - 1) / kWsKeys + 1 : 0;
  auto wait_full = [&](int kt) {
    mbarrier_wait(&full[kt % kS], (kt / kS) & 1);
    fence_proxy_async();  // the landed copies (generic proxy), seen by this thread's products (async proxy)
  };
  auto release = [&](int kt) {  // this warp's products reading tile kt's stage have retired
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&empty[kt % kS]);
  };

  float o[32], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, sc[kWsKeys / 2], alpha[2];
#pragma unroll
  for (int i = 0; i < 32; ++i) o[i] = 0.0f;
  uint32_t pa[kWsKeys / 16][4];
  uint32_t qa[kQRegs ? kD / 16 : 1][4];
  const uint64_t q_desc = kmajor_desc(smem_u32(q_slot(c)));
  auto issue_s = [&](int kt) { issue_scores<kParts, kQRegs>(sc, qa, q_desc, kmajor_desc(smem_u32(stage_k(kt)))); };
  auto issue_pv = [&](int kt) {
    const uint64_t v_desc = mnmajor_desc(smem_u32(stage_v(kt)));
#pragma unroll
    for (int p = 0; p < kWsKeys / 16; ++p) wgmma_rs_mn(o, pa[p], desc_advance(v_desc, 2048 * p), true);
  };
  auto softmax = [&](int kt) {
    const int k0 = kt * kWsKeys;
    with_mask<true>(k0 + kWsKeys - 1 <= qw, [&](auto masked) {
      online_softmax<decltype(masked)::value>(sc, m, l, alpha, k0, qw, g, tq, scale_log2);
    });
  };

  if (num_kt_wg > 0) {
    mbarrier_wait(q_full, 0);
    fence_proxy_async();
    if constexpr (kQRegs) load_a_sw128(qa, q_slot(c), w, lane);
  }
  if constexpr (!kOverlap) {  // attention_forward_wgmma_kernel's loop
    for (int kt = 0; kt < num_kt_wg; ++kt) {
      wait_full(kt);
      if constexpr (kQRegs) fence_operands(qa);
      wgmma_fence();
      issue_s(kt);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(sc);
      softmax(kt);
      rescale_rows(o, alpha);
      pack_p(pa, sc);
      fence_operands(o);
      fence_operands(pa);
      wgmma_fence();
      issue_pv(kt);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(o);
      release(kt);
    }
  } else if (num_kt_wg > 0) {
    // Tile 0: S, its softmax, P (O is 0: no rescale).
    wait_full(0);
    if constexpr (kQRegs) fence_operands(qa);
    wgmma_fence();
    issue_s(0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(sc);
    softmax(0);
    pack_p(pa, sc);
    for (int kt = 1; kt < num_kt_wg; ++kt) {
      wait_full(kt);
      fence_operands(o);
      fence_operands(pa);
      if constexpr (kQRegs) fence_operands(qa);
      wgmma_fence();
      issue_s(kt);
      wgmma_commit();
      issue_pv(kt - 1);
      wgmma_commit();
      wgmma_wait<1>();  // S (tile kt - 1's P V may still run)
      fence_operands(sc);
      softmax(kt);
      wgmma_wait<0>();  // tile kt - 1's P V: O and pa are free, and so is its stage
      fence_operands(o);
      fence_operands(pa);
      release(kt - 1);
      rescale_rows(o, alpha);
      pack_p(pa, sc);
    }
    fence_operands(o);
    fence_operands(pa);
    wgmma_fence();
    issue_pv(num_kt_wg - 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
    release(num_kt_wg - 1);
  }
  for (int kt = num_kt_wg; kt < num_kt; ++kt) {  // the block's tiles past this warpgroup's rows: released unread
    mbarrier_wait(&full[kt % kS], (kt / kS) & 1);
    release(kt);
  }
  if (num_kt_wg == 0) return;  // warpgroup-uniform: no rows (no barrier follows for it)
  // The staging rows overlay the warpgroup's Q tile, which its other warps' products read: wait for all four.
  named_barrier_sync(1 + c, kThreads);
  if (qw >= T) return;
  finish_forward(out + static_cast<int64_t>(b) * T * C + static_cast<int64_t>(h) * kD, lse, o, m, l,
                 reinterpret_cast<bf16*>(q_slot(c)) + w * 16 * kStageLd, bh, qw, T, C, lane);
}

template <int kWG>
void ws_launch(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, float scale_log2,
               cudaStream_t stream) {
  const auto kernel = attention_forward_wgmma_ws_kernel<kWG>;
  constexpr int kBlockThreads = kThreads * (kWG + 1);
  check_ws_registers(kernel, kBlockThreads);
  set_smem(kernel, WsFwdCfg<kWG>::kBytes);
  prefer_shared_memory(kernel);
  const dim3 grid(static_cast<unsigned>(ceil_div(T, kBQ * kWG)), static_cast<unsigned>(B * NH));
  kernel<<<grid, kBlockThreads, WsFwdCfg<kWG>::kBytes, stream>>>(out, lse, qkv, T, C, NH, scale_log2,
                                                                 attention_sections(B * NH, T, kD, sizeof(bf16)));
}

}  // namespace

void forward_ws(int consumers, bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, float scale_log2,
                cudaStream_t stream) {
  GPT_CHECK(consumers == 2 || consumers == 3);
  if (consumers == 2) {
    ws_launch<2>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
  } else {
    ws_launch<3>(out, lse, qkv, B, T, C, NH, scale_log2, stream);
  }
}

}  // namespace attention_wgmma_detail

}  // namespace gpt::cuda
