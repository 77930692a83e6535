// FlashAttention-2-style fused causal attention on the tensor cores through mma.sync (attention_mma.cu): bf16 qkv,
// output and dqkv, the same arguments, lse state, dropout mask and deterministic backward as attention_tc.cu, with
// S, P, dP and dS kept in registers (never in shared memory) and the K/V (forward, dQ) or Q/dO (dK/dV) tiles
// double-buffered through cp.async. The same roundings as attention_tc.cu: P times the dropout factor and dS
// rounded to bf16 before their products, dO in bf16 (the model's is; the backward takes it so, and D too), l summed
// over the fp32 P, D = rowsum(dO * O) in fp32.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/backend.h"

namespace gpt::cuda {

// True when these kernels handle the shape: head size C / NH of 32, 64 or 128 (then C is a multiple of 8, so every
// row of every head starts 16-byte aligned in qkv and out).
bool attention_mma_supported(int C, int NH);

// The most dynamic shared memory one block of these kernels takes at this head size (forward with and without
// dropout, dK/dV, dQ): a GPU that allows less per block (cudaDevAttrMaxSharedMemoryPerBlockOptin: 99 KB on sm_86
// and sm_89, against 163 KB on A100 and 227 KB on H100) cannot run them. REQUIRES attention_mma_supported(C, NH).
size_t attention_mma_smem_bytes(int C, int NH);

// out(B,T,C) bf16 (rounded to nearest even), lse(B,NH,T) from qkv(B,T,3C) bf16. REQUIRES attention_mma_supported(C,
// NH) and 16-byte aligned out and qkv.
void attention_forward_mma(TensorPtr out, float* lse, ConstTensorPtr qkv, int B, int T, int C, int NH,
                           const DropoutMask& drop, cudaStream_t stream);

// The backward's scratch: D (B,NH,T floats), and at head size 32 or 64 without dropout dS^T (bf16, B NH Tp^2, Tp =
// T rounded up to 64), unless that passes cuda_workspace::kAttentionDsMaxBytes, then the wgmma kernels' qkv bias
// partials (cuda_workspace::attention_bias_partials).
size_t attention_backward_mma_scratch_bytes(int B, int T, int C, int NH, bool dropout);

// dqkv(B,T,3C) bf16 (overwritten) from dout(B,T,C) bf16, forward's out (bf16) and lse. With dqkv_bias not null, the
// wgmma kernels (sm_90, head size 64, no dropout) also add dqkv's column sums (as stored, bf16) into it, the qkv
// projection's bias gradient, in their own order: returns whether they did (or B T is 0); false leaves that to the
// caller (bias_backward). REQUIRES attention_mma_supported(C, NH), 16-byte aligned dqkv, dout, qkv, out and scratch
// of attention_backward_mma_scratch_bytes.
bool attention_backward_mma(TensorPtr dqkv, const bf16* dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* lse,
                            int B, int T, int C, int NH, const DropoutMask& drop, float* dqkv_bias, void* scratch,
                            cudaStream_t stream);

}  // namespace gpt::cuda
