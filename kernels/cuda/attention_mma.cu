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
//  - Every block has 4 warps; each warp owns whole rows of the products it accumulates (16 or 32 query rows in the
//    forward: forward_rows16; 16 keys in dK/dV, 16 queries in dQ), so sums run in a fixed order and no
//    two warps write one element: deterministic, no atomics. The forward keeps Q's fragments in registers at
//    D <= 64 and reads them from shared memory per tile at D = 128, as FlashAttention-2 does there.
//  - The backward takes dO in bf16 (the model's; CudaBackend rounds an fp32 one first) and first writes
//    D = rowsum(dO * O), so the main kernels copy bf16 tiles only. lse is read as lse * log2(e), and the kernels
//    exponentiate with exp2f.
//  - Work above the diagonal is skipped 16 keys at a time (P and dS there are zero), as in attention_tc.cu. Tiles
//    wholly below it for a warp (most of them) take a copy of the softmax / dS code without the per-element mask,
//    as FlashAttention-2 separates its masking iterations (not with dropout, nor in the D = 128 forward: there
//    ptxas spilled). The same math in both copies: the forward's online softmax takes the maximum of the raw scores
//    and folds the scale into exp2's argument (one FFMA per element); in the backward kernels the compiler may fuse
//    the scaling into the exponent's argument likewise (the last bit of P's fp32 value may differ, far below its
//    bf16 rounding).
//  - At head sizes 32 and 64 without dropout the dK/dV kernel also writes dS^T (bf16) to the scratch, and the dQ
//    kernel multiplies it by K instead of recomputing S, P and dP (cuda_workspace::attention_ds_kept).
//
// This file: the forward and the public entry points but the backward's; attention_mma_backward.cu: the backward;
// attention_mma.cuh: what they share.
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

// The forward's body, for the kernels below.
template <int D, bool kDrop, int kRows>
__device__ __forceinline__ void attention_forward_mma(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH,
                                                      float scale_log2, DropoutMask drop, float keep, int sections) {
  using Cfg = FwdCfg<D, kDrop, kRows>;
  constexpr int MT = Cfg::MT, BQ = Cfg::BQ, BK = Cfg::BK, LD = Cfg::LD;
  constexpr bool kUnmaskedPath = !kDrop && D <= 64;
  constexpr int KD = D / 16, ND = D / 8, NC = BK / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw + Cfg::kQ);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane >> 2, tq = lane & 3;

  const CausalTile tile = causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections);
  const int bh = tile.bh, b = bh / NH, h = bh % NH;
  const int q0 = (gridDim.x - 1 - tile.rank) * BQ;  // rank 0: the last query tile, with the most keys
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
                                 DropoutMask drop, float keep, int sections) {
  attention_forward_mma<D, kDrop, kDefaultFwdRows<D, kDrop>>(out, lse, qkv, T, C, NH, scale_log2, drop, keep, sections);
}

// 16 rows per warp (D <= 64, no dropout: forward_rows16 below): ptxas fits it in 127 registers for 4 blocks
// per SM (sm_90, no spills), where 32 rows take 239 and allow 2.
template <int D>
__global__ void __launch_bounds__(kThreads, 4)
    attention_forward_mma16_kernel(bf16* out, float* lse, const bf16* qkv, int T, int C, int NH, float scale_log2,
                                   DropoutMask drop, float keep, int sections) {
  attention_forward_mma<D, false, 16>(out, lse, qkv, T, C, NH, scale_log2, drop, keep, sections);
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
  kernel<<<grid, kThreads, smem, stream>>>(out, lse, qkv, T, C, NH, scale_log2, drop, keep_scale(drop),
                                           attention_sections(B * NH, T, D, sizeof(bf16)));
  GPT_CUDA_CHECK_LAUNCH();
}

// The forward at D <= 64 without dropout takes 16 query rows per warp, 64 per block, unless GPT_ATTENTION_FWD_ROWS=32
// (read at each launch) asks for the 32 and 128 of the other cases. On an H200 the 32-row kernel ran at 12% occupancy
// (8 warps per SM, held by registers and shared memory) with no warp eligible in 54% of cycles; 16 rows allow 4 blocks
// (16 warps) at the cost of twice the K and V fragment loads per product. Measured there at GPT-2 124M's shape
// (gpu_vs_pytorch.sh, with the lean backward below): 470,630 tokens/s against 458,177 with both off. The same products
// and sums in the same order; a row's tiles may take the masked copy of the softmax where 32 rows took the unmasked
// one (or back), which may differ in the last bit of P before its bf16 rounding.
// On sm_90 the wgmma forward (attention_wgmma.h) comes first: this choice is the mma.sync kernels' (there under
// GPT_ATTENTION_WGMMA=0).
bool forward_rows16() { return !env_is("GPT_ATTENTION_FWD_ROWS", "32"); }

template <int D>
void forward_impl(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, const DropoutMask& drop,
                  cudaStream_t stream) {
  if (drop.active()) {
    forward_launch<D, true>(out, lse, qkv, B, T, C, NH, drop, stream);
    return;
  }
  if constexpr (D == 64) {
    if (attention_wgmma_forward_usable(C, NH, false)) {  // sm_90: the same forward on wgmma
      attention_forward_wgmma(out, lse, qkv, B, T, C, NH, stream);
      return;
    }
  }
  if constexpr (D <= 64) {
    if (forward_rows16()) {
      forward_launch<D, false, 16>(out, lse, qkv, B, T, C, NH, drop, stream);
      return;
    }
  }
  forward_launch<D, false>(out, lse, qkv, B, T, C, NH, drop, stream);
}

}  // namespace

bool attention_mma_supported(int C, int NH) { return attention_tc_supported(C, NH); }  // the same head sizes

size_t attention_mma_smem_bytes(int C, int NH) {
  GPT_CHECK(attention_mma_supported(C, NH));
  size_t bytes = 0;
  with_head_size(C / NH, [&](auto d) {
    constexpr int D = decltype(d)::value;
    bytes = std::max({FwdCfg<D, false>::kBytes, FwdCfg<D, true>::kBytes, BwdKvCfg<D>::kBytes, BwdQCfg<D>::kBytes,
                      BwdQDsCfg<D>::kBytes, D == 64 ? attention_wgmma_smem_bytes() : size_t{0}});
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

}  // namespace gpt::cuda
