// Tensor-core (bf16 WMMA, fp32 accumulate) fused causal attention: the fast path of attention.cu, with the same
// arguments, layout, lse state, dropout mask and deterministic three-kernel backward. dO is fp32 in global memory;
// qkv, the output O and dqkv all fp32 or all bf16; q, k, v (when fp32) and dO are rounded to bf16 in shared memory, as
// are the probabilities P (times the dropout factor) and dS before their products (as FlashAttention does). Softmax
// statistics and lse stay fp32; D = rowsum(dO * O) sums in fp32 over O rounded to bf16 (FlashAttention's bf16 O).
// Results match attention.cu to bf16 precision (~1e-2 relative), not bitwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backend/backend.h"

namespace gpt::cuda {

// True when the tensor-core kernels handle this shape: head size C / NH of 32, 64 or 128.
bool attention_tc_supported(int C, int NH);

// The most dynamic shared memory one block of these kernels takes at this head size (as attention_mma_smem_bytes).
// REQUIRES attention_tc_supported(C, NH).
size_t attention_tc_smem_bytes(int C, int NH);

// out(B,T,C) (qkv's dtype; bf16 rounded to nearest even at the store), lse(B,NH,T) from qkv(B,T,3C). REQUIRES
// attention_tc_supported(C, NH) and 16-byte aligned out and qkv.
void attention_forward_tc(TensorPtr out, float* lse, ConstTensorPtr qkv, int B, int T, int C, int NH,
                          const DropoutMask& drop, cudaStream_t stream);

// dqkv(B,T,3C) (overwritten; qkv's dtype) from dout(B,T,C) (f32 or bf16), forward's out and lse. REQUIRES
// attention_tc_supported(C, NH), 16-byte aligned dqkv, dout, qkv, and scratch of attention_backward_scratch_bytes (the
// fp32 path's D, from out as bf16: an fp32 out is rounded, so the result does not depend on the dtype out is stored
// in).
void attention_backward_tc(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out,
                           const float* lse, int B, int T, int C, int NH, const DropoutMask& drop, void* scratch,
                           cudaStream_t stream);

}  // namespace gpt::cuda
