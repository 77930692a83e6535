// Causal attention on Hopper's warpgroup tensor-core instruction (wgmma, sm_90a; attention_wgmma.cu): the mma.sync
// kernels of attention_mma.cu at head size 64 without dropout, with their products issued by a warpgroup from shared
// memory and registers instead of ldmatrix + mma.sync per warp: the forward, and the backward where it keeps dS^T
// (a dK/dV kernel that writes it, a dQ kernel that multiplies it by K). The same arguments, outputs and math (the
// online softmax, its scale folded into exp2, P and dS rounded to bf16 before their products), but exp2 flushes
// probabilities under 2^-126 to 0 (exp2_ftz: one MUFU.EX2). Built for sm_90a only
// (its own object library); attention_mma.cu and attention_mma_backward.cu call them where the *_usable functions
// say so, and take their own kernels elsewhere. GPT_ATTENTION_WGMMA=0 turns both off, =fwd the backward.
// GPT_ATTENTION_WGMMA_OVERLAP=1 (or fwd, bwd: one of them) takes their variants whose element-wise work overlaps the
// products, GPT_ATTENTION_WGMMA_WG2=1 (or a comma-separated list of fwd, kv, dq) blocks of two warpgroups that share
// their K/V, Q/dO or K tiles (half those tiles' copies per product); the same values, not yet measured on a GPU.
// GPT_ATTENTION_WGMMA_BK=128: the forward (not the overlapped one) on key tiles of 128 (the online softmax steps by
// 128 keys: not the same values to the bit; not yet measured on a GPU). The overlapped forward keeps one warpgroup
// and 64 keys: with GPT_ATTENTION_WGMMA_OVERLAP on for it, BK=128 does nothing and WG2 applies to the backward alone.
// GPT_ATTENTION_WGMMA_WS=2 or 3: the forward warp-specialised (attention_wgmma_ws.cu: a producer warp and 2 or 3
// consumer warpgroups; GPT_ATTENTION_WGMMA_BK=128's values bit for bit; not yet run on a GPU); it takes precedence
// over the forward's other switches. GPT_ATTENTION_WGMMA_WS_KV=2 or 3: the dK/dV kernel warp-specialised (a producer
// warp, 2 or 3 consumer warpgroups; the default's values bit for bit; not yet run on a GPU; over WG2 and DS_STAGE for
// it, and overlapped under OVERLAP (1 or bwd; at 3 only at 32 queries per step)).
// The lists take no spaces (fwd,dq). GPT_ATTENTION_WGMMA_FWD_BLOCKS=4: the default forward as compiled before it was
// bounded to 5 blocks per SM (107 registers instead of 96; the same values).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/dtype.h"

namespace gpt::cuda {

// Whether the current device is sm_90 (H100, H200: these kernels are built for sm_90a, which runs there only), the
// shape is head size 64 without dropout, and GPT_ATTENTION_WGMMA (read at each call) is not 0.
bool attention_wgmma_forward_usable(int C, int NH, bool dropout);

// Whether the backward runs on wgmma too (attention_wgmma_forward_usable, and GPT_ATTENTION_WGMMA is not "fwd").
// Only where the backward keeps dS^T (cuda_workspace::attention_ds_kept): its kernels pass it.
bool attention_wgmma_backward_usable(int C, int NH, bool dropout);

// The most shared memory one block of these kernels takes (for attention_mma_smem_bytes' maximum).
size_t attention_wgmma_smem_bytes();

// out(B,T,C) bf16, lse(B,NH,T) from qkv(B,T,3C) bf16, as attention_forward_mma. REQUIRES
// attention_wgmma_forward_usable(C, NH, false), 16-byte aligned out and qkv.
void attention_forward_wgmma(bf16* out, float* lse, const bf16* qkv, int B, int T, int C, int NH, cudaStream_t stream);

// dqkv(B,T,3C) (overwritten) from bf16 dout, qkv, lse and dvec = rowsum(dO * O) (B,NH,T), as attention_backward_mma
// where it keeps dS^T: a dK/dV kernel that also writes dS^T (bf16, not yet times the scale) into ds (row stride
// ds_ld >= T rounded up to 64, ds_ld^2 per (b, h): attention_mma_backward.cu's layout), then a dQ kernel that
// multiplies it by K. GPT_ATTENTION_WGMMA_BQ=64 gives the dK/dV kernel 64 queries per step instead of 32.
// dqkv_bias (or null): += dqkv's column sums over the B T rows, of the values as stored (bf16): each warp of both
// kernels sums the 16 rows it stores into bias_partials (cuda_workspace::attention_bias_partials, 8-byte aligned),
// then two small passes add those in a fixed order (the qkv projection's bias gradient without bias_backward's pass
// over dqkv: 75 MB per layer at GPT-2 124M's batch 16).
// REQUIRES attention_wgmma_backward_usable(C, NH, false), 16-byte aligned pointers.
void attention_backward_wgmma(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* dvec, int B,
                              int T, int C, int NH, bf16* ds, int64_t ds_ld, float* dqkv_bias, float* bias_partials,
                              cudaStream_t stream);

}  // namespace gpt::cuda
