// Warp-level bf16 tensor-core instructions as inline PTX (sm_80 and later): mma.sync m16n8k16 with fp32
// accumulators, ldmatrix (8x8 b16 matrices from shared memory, plain or transposed) and cp.async (16 bytes from
// global to shared memory without a register round trip, in commit groups); pack_bf16x2 (cvt.rn.bf16x2.f32) is in
// common.cuh. In the CPU emulator (tests/cuda_emu), the shim's emulations of the same instructions, which keep the
// registers in the layouts below, so a kernel that indexes them wrongly computes wrong results there too.
//
// Register layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), for lane = 4 g + t (g = lane / 4, t = lane % 4),
// each 32-bit register holding two bf16 (the lower index in the low half):
//   A (16 x 16, row): a[r] = A[g + 8 (r % 2)][2 t + 8 (r / 2) + {0, 1}]
//   B (16 x 8, col):  b[r] = B[2 t + 8 r + {0, 1}][g]
//   C, D (16 x 8):    d[r] = D[g + 8 (r / 2)][2 t + r % 2]
// So the accumulators of two n-adjacent m16n8 products, packed to bf16 pairwise, are the A fragment of the next
// product over those 16 columns (how a flash-attention kernel turns S into P without shared memory).
// ldmatrix.x4: lanes 8 i .. 8 i + 7 give the row addresses of matrix i (16-byte aligned); register i receives
// matrix i's element (g, 2 t + {0, 1}), or with .trans (2 t + {0, 1}, g).
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"

#ifdef GPT_CUDA_EMULATOR
#include "emu_ptx.h"
#endif

namespace gpt::cuda {

// d += a b (m16n8k16, bf16 inputs, fp32 accumulation).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#ifdef GPT_CUDA_EMULATOR
  emu_mma_bf16_16816(d, a, b0, b1);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#elif defined(__CUDA_ARCH__)
  __trap();  // built for sm_80 and sm_90 only
#endif
}

// Four 8x8 bf16 matrices from shared memory, transposed when kTrans: `row` is this lane's row address (see above).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4_impl(uint32_t (&r)[4], const void* row) {
#ifdef GPT_CUDA_EMULATOR
  emu_ldmatrix(r, 4, kTrans, row);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl<false>(r, row); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) { ldmatrix_x4_impl<true>(r, row); }

// 16 bytes from global `src` to shared `dst` (both 16-byte aligned), asynchronously: the first `src_bytes` (0 or
// 16) from src, the rest zeros (src is not read when 0, but must still be a valid address). Complete for this
// thread after cp_async_commit and the cp_async_wait that covers its group; for the block after a __syncthreads.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, uint32_t src_bytes) {
#ifdef GPT_CUDA_EMULATOR
  emu_cp_async_16(dst, src, src_bytes);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(src_bytes) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
// Closes this thread's copies issued since the last commit into a group.
__device__ __forceinline__ void cp_async_commit() {
#ifdef GPT_CUDA_EMULATOR
  emu_cp_async_commit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups (the newest) are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef GPT_CUDA_EMULATOR
  emu_cp_async_wait(N);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

}  // namespace gpt::cuda
