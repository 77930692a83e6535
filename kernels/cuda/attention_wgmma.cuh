// attention_wgmma.cu's and attention_wgmma_backward.cu's shared part (their own, not an interface): the tile
// sizes, the backward's shared-memory layout, the swizzled tile copy and the switches. Read attention_wgmma.cu's
// opening comment first.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "kernels/cuda/attention_mma.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mbarrier_ptx.cuh"
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
// The warp-specialised kernels' (attention_wgmma_ws.cu, GPT_ATTENTION_WGMMA_WS; the dK/dV kernel's kWS): keys per K/V
// tile of the forward, and stages of their rings.
constexpr int kWsKeys = 128, kWsStages = 3;
// A consumer warpgroup's 64-row tile slot (Q in the forward, K and V in the dK/dV kernel): the tile (8 KB), and after
// its last product its four warps' output staging rows (16 x kStageLd bf16 each): 9216 bytes, a multiple of 1024.
constexpr uint32_t kWsKVSlot = 4 * 16 * kStageLd * sizeof(bf16);
static_assert(kWsKVSlot >= kTile && kWsKVSlot % 1024 == 0);
// The registers per thread a warp-specialised block of `threads` has at launch when ptxas takes the launch bound's
// whole share (rounded down to 8): what its setmaxnreg counts are sized for.
__host__ __device__ constexpr int ws_launch_regs(int threads) { return 65536 / threads / 8 * 8; }
// setmaxnreg at 2 or 3 consumer warpgroups (FA3's): the producer warpgroup's and each consumer's registers. 128 x 24 +
// 256 x 240 are the 384 x 168 registers a block of 2 has at launch, 128 x 32 + 384 x 160 the 512 x 128 of 3 (inc
// takes only what dec gave back).
__host__ __device__ constexpr int ws_load_regs(int consumers) { return consumers == 2 ? 24 : 32; }
__host__ __device__ constexpr int ws_mma_regs(int consumers) { return consumers == 2 ? 240 : 160; }
static_assert(128 * (ws_load_regs(2) + 2 * ws_mma_regs(2)) <= 384 * ws_launch_regs(384));
static_assert(128 * (ws_load_regs(3) + 3 * ws_mma_regs(3)) <= 512 * ws_launch_regs(512));
// At each launch of a warp-specialised kernel (as set_smem's attribute, a host call of about a microsecond): that the
// kernel launched was built with those registers. With fewer, its consumers' setmaxnreg.inc would wait for registers
// the block never freed: a hang on the GPU, an error here instead. The emulator models no registers.
template <class Kernel>
void check_ws_registers(Kernel kernel, int threads) {
#ifndef GPT_CUDA_EMULATOR
  cudaFuncAttributes attr{};
  GPT_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  GPT_CHECK_MSG(attr.numRegs == ws_launch_regs(threads),
                "a warp-specialised attention kernel built with other than the launch bound's registers: its "
                "setmaxnreg counts would not fit (see attention_wgmma.cuh)");
#else
  (void)kernel, (void)threads;
#endif
}

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
  // The warp-specialised kernel's (kWsKVSlot per K and V tile, kWsStages stages, its mbarriers).
  static constexpr size_t ws_bytes(int kWG) {
    return 2 * kWG * size_t{kWsKVSlot} + kWsStages * size_t{kStageBytes} + 4 * kWG * size_t{kDsWarpBytes} +
           8 * (1 + 2 * kWsStages) + 1024;
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

// The producer warp's copy of rows [row0, row0 + ROWS) of a bf16 matrix (row stride ld) into a swizzled tile, as
// copy_tile_sw128 (rows at or past `rows` zero-filled): lane t copies piece t % 8 of rows t / 8, t / 8 + 4, ... in a
// rolled loop, one pointer step per row: a warp-specialised kernel's producer runs on few registers (ws_load_regs),
// where copy_tile_sw128's unrolled addresses spill (ptxas: about 900 bytes in the forward).
template <int ROWS>
__device__ __forceinline__ void producer_copy(unsigned char* dst, const bf16* src, int64_t ld, int row0, int rows,
                                              int lane) {
  const int c = (lane % 8) * 8;
  int r = lane / 8;
  const bf16* p = src + static_cast<int64_t>(row0 + r) * ld + c;
#pragma unroll 1
  for (; r < ROWS; r += kWarp / 8, p += kWarp / 8 * ld) {
    const bool in = row0 + r < rows;
    cp_async_16(dst + sw128_offset(r, c), in ? p : src + c, in ? 16u : 0u);
  }
}

// The forward's parts (attention_wgmma.cu, attention_wgmma_ws.cu).
// The forward's online softmax of one tile's scores (the warp's rows g, g + 8 of sc: [4 n + 2 hf + e] = row g + 8
// hf, key k0 + 8 n + 2 tq + e; 2 N keys, 64 or 128), as attention_mma.cu's: sc becomes P (fp32), m and l are
// updated, alpha is the factor O's rows take before this tile's P V (0 on the first tile). kMasked: the causal mask
// (the padded rows past T need none: they are never stored); without it (a tile whose every key precedes the warp's
// every row: all but the diagonal one) no test per element.
template <bool kMasked, int N>
__device__ __forceinline__ void online_softmax(float (&sc)[N], float (&m)[2], float (&l)[2], float (&alpha)[2], int k0,
                                               int qw, int g, int tq, float scale_log2) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int t = qw + g + 8 * hf;
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < N / 4; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = sc[4 * n + 2 * hf + e];  // the raw score: the scale goes into exp2's FFMA below
        if (kMasked && k0 + n * 8 + 2 * tq + e > t) x = -INFINITY;
        mx = fmaxf(mx, x);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // Finite from the first tile on: key 0 is visible to every row. All four lanes of a row agree bitwise.
    const float m_new = fmaxf(m[hf], mx * scale_log2);
    alpha[hf] = exp2_ftz(m[hf] - m_new);  // 0 on the first tile (m = -inf)
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < N / 4; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = sc[4 * n + 2 * hf + e];
        x = exp2_ftz(fmaf(x, scale_log2, -m_new));  // 0 where masked (-inf); one rounding
        sum += x;
      }
    }
    l[hf] = l[hf] * alpha[hf] + sum;
    m[hf] = m_new;
  }
}

// O's rows g, g + 8 times alpha.
__device__ __forceinline__ void rescale_rows(float (&o)[32], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    o[4 * n] *= alpha[0], o[4 * n + 1] *= alpha[0];
    o[4 * n + 2] *= alpha[1], o[4 * n + 3] *= alpha[1];
  }
}

// The forward's S = Q K^T for one key tile of 64 kParts keys (part j: the m64n64 product of the tile's keys 64 j..,
// into sc[32 j..]), 4 k-steps each: Q's A from its swizzled tile (q_desc) or, with kQRegs, from qa (load_a_sw128's
// fragments); K from its tile (k_desc), K-major. At kParts 2 one m64n128k16 per k-step instead: its accumulators are
// the two parts' side by side and the parts' K tiles lie one after the other (8-row groups 1024 bytes apart
// throughout), so the same values, with half the instructions and Q's A read once (from shared memory, without
// kQRegs) instead of twice. Issued only: the caller fences, commits and waits.
template <int kParts, bool kQRegs, int NQ>
__device__ __forceinline__ void issue_scores(float (&sc)[32 * kParts], const uint32_t (&qa)[NQ][4], uint64_t q_desc,
                                             uint64_t k_desc) {
  static_assert(kTile == 8 * 1024);  // part 1's K rows 64.. where one descriptor of 128 rows puts them
  if constexpr (kParts == 2) {
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if constexpr (kQRegs) {
        wgmma_rs<128, 0>(sc, qa[kk], desc_advance(k_desc, 32 * kk), kk > 0);
      } else {
        wgmma_ss<128>(sc, desc_advance(q_desc, 32 * kk), desc_advance(k_desc, 32 * kk), kk > 0);
      }
    }
    return;
  }
#pragma unroll
  for (int j = 0; j < kParts; ++j) {
    float(&part)[32] = *reinterpret_cast<float(*)[32]>(sc + 32 * j);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      if constexpr (kQRegs) {
        wgmma_rs<64, 0>(part, qa[kk], desc_advance(k_desc, j * kTile + 32 * kk), kk > 0);
      } else {
        wgmma_ss<64>(part, desc_advance(q_desc, 32 * kk), desc_advance(k_desc, j * kTile + 32 * kk), kk > 0);
      }
    }
  }
}

// P (sc, fp32) as the A registers of P V, per 16 keys, rounded to bf16.
template <int N>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[N / 8][4], const float (&sc)[N]) {
#pragma unroll
  for (int c = 0; c < N / 8; ++c) {
#pragma unroll
    for (int r = 0; r < 4; ++r) pa[c][r] = pack_bf16x2(sc[8 * c + 2 * r], sc[8 * c + 2 * r + 1]);
  }
}

// The forward's end for a warp with rows below T: lse, and O / l as bf16 into out, staged through the warp's 16 rows
// (of kStageLd) at `stage` (shared memory no product reads any more).
__device__ __forceinline__ void finish_forward(bf16* out, float* lse, const float (&o)[32], const float (&m)[2],
                                               const float (&l)[2], bf16* stage, int bh, int qw, int T, int C,
                                               int lane) {
  const int g = lane >> 2, tq = lane & 3;
  float inv[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float sum = l[hf];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[hf] = 1.0f / sum;
    const int t = qw + g + 8 * hf;
    if (tq == 0 && t < T) lse[static_cast<int64_t>(bh) * T + t] = (m[hf] + log2f(sum)) * kLn2;
  }
  float acc[1][kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    acc[0][n][0] = o[4 * n] * inv[0], acc[0][n][1] = o[4 * n + 1] * inv[0];
    acc[0][n][2] = o[4 * n + 2] * inv[1], acc[0][n][3] = o[4 * n + 3] * inv[1];
  }
  store_rows<1, kD, kStageLd>(out, C, acc, 1.0f, stage, qw, T, lane);
}

// The warp-specialised forward (attention_wgmma_ws.cu, GPT_ATTENTION_WGMMA_WS): its launch at 2 or 3 consumer
// warpgroups (attention_forward_wgmma's arguments). Its shared memory (up to 125 KB) and the warp-specialised dK/dV
// kernel's (up to 170 KB) are not in attention_wgmma_smem_bytes: sm_90 alone runs them, which has 227 KB per block.
void forward_ws(int consumers, bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, float scale_log2,
                cudaStream_t stream);

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
