// Warpgroup-level bf16 tensor-core instructions as inline PTX (sm_90a only: wgmma.mma_async), for kernels built
// for that target alone (kernels/cuda/CMakeLists.txt's gpt_cuda_sm90a): wgmma m64n64k16, m64n32k16 and m64n128k16
// with fp32 accumulators (the layouts below are N = 64's; at N = 32, i < 16; at N = 128, i < 64, B K-major only),
// its fence / commit / wait, the shared-memory matrix descriptors for 128-byte-swizzled tiles, and the proxy
// fence between generic-proxy writes (stores, cp.async) and wgmma's reads. In the CPU emulator (tests/cuda_emu),
// the shim's emulations (emu_ptx.h), which read shared memory through the same descriptors and swizzle.
//
// The layouts (PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"): a warpgroup is 4 consecutive
// warps (warp w = threadIdx.x / 32 % 4 of it); for lane = 4 g + t:
//   D (64 x 64, fp32):  d[i] = D[16 w + g + 8 ((i / 2) % 2)][8 (i / 4) + 2 t + i % 2], i < 32: per warp, its 16
//                        rows as eight mma.sync m16n8 accumulator tiles side by side (d[4 n + e] = tile n's e);
//   A from registers (64 x 16, bf16): a[r] = A[16 w + g + 8 (r % 2)][2 t + 8 (r / 2) + {0, 1}], r < 4: the
//                        mma.sync m16n8k16 A fragment of the warp's rows (mma_ptx.cuh), so two accumulator tiles
//                        packed pairwise (attention_mma.cuh's pack_a) are the A of the next product.
// Shared tiles here are rows of 64 bf16 (128 bytes) with the 128-byte swizzle: element (r, c) of a tile at a
// 1024-byte aligned shared address lives at byte r * 128 + 16 ((c / 8) ^ (r % 8)) + 2 (c % 8) (sw128_offset), the
// hardware's pattern (address bits 4-6 XOR bits 7-9), so that the 8 rows of a 16-byte column fall in distinct banks.
//   - K-major operand (rows = M or N, 64 columns = K, e.g. Q or K in S = Q K^T): k-step kk (16 columns) is the
//     descriptor of the tile's start + 32 kk bytes; stride between 8-row groups (SBO) 1024 bytes.
//   - MN-major B (rows = K, 64 columns = N, e.g. V in O = P V), with the instruction's transpose-B flag: k-step kk
//     (16 rows) starts at + 2048 kk bytes, two 8-row swizzle atoms 1024 bytes apart (LBO = SBO = 1024: N = 64 is
//     one atom wide, so the one stride that matters is the same in either reading of the two fields).
// Asynchrony: fence_operands on the batch's accumulators and A registers, then wgmma_fence(), before the first wgmma
// of a batch (so every register write to them precedes the fence), wgmma_commit() after the batch, wgmma_wait<N>()
// until at most N batches are in flight, and fence_operands(d) after the wait, so the compiler neither reads d before
// the wait nor moves writes across it (CUTLASS's warpgroup_fence_operand, arrive, commit, wait).
// Shared memory written by ordinary stores or cp.async must be followed by fence_proxy_async() in every writing
// thread, then a barrier, before a wgmma reads it; or, where an mbarrier orders the writes (mbarrier_ptx.cuh), by
// fence_proxy_async() in the reading thread after its wait.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"

#ifdef GPT_CUDA_EMULATOR
#include "emu_ptx.h"
#endif

#if defined(__CUDA_ARCH__) && !defined(GPT_CUDA_EMULATOR)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GPT_WGMMA_PTX 1
#elif __CUDA_ARCH__ == 900
#error "wgmma_ptx.cuh compiled for sm_90 without the a suffix: build its kernels for 90a (gpt_cuda_sm90a)"
#endif
#endif

namespace gpt::cuda {

constexpr int kSw128Row = 128;  // bytes per swizzled row: 64 bf16

__host__ __device__ constexpr uint32_t sw128_offset(int r, int c) {
  return static_cast<uint32_t>(r * kSw128Row + 16 * ((c >> 3) ^ (r & 7)) + 2 * (c & 7));
}

// The shared-window address of a pointer into shared memory (the emulator's: its offset in the dynamic shared memory).
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
#ifdef GPT_CUDA_EMULATOR
  return emu_smem_offset(p);
#else
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
#endif
}

// The first 1024-byte aligned shared address at or after p: where the swizzled tiles start (the swizzle is a function
// of address bits 4-9, so a tile must begin on a 1024-byte boundary). A kernel asks for 1024 bytes more than its
// tiles take.
__device__ __forceinline__ unsigned char* align_1024(unsigned char* p) {
  return p + (1024 - smem_u32(p) % 1024) % 1024;
}

// 2^x as the wgmma kernels' softmax takes it: ex2.approx.ftz.f32, MUFU.EX2 alone, where exp2f without fast-math
// (ex2.approx.f32) adds a range test and two multiplies per call to keep subnormal results: probabilities under
// 2^-126, which the products cannot tell from 0 beside the row's largest, 1. Subnormal inputs count as 0 as well.
// The emulator: exp2f with both flushed.
__device__ __forceinline__ float exp2_ftz(float x) {
#ifdef GPT_CUDA_EMULATOR
  if (std::fpclassify(x) == FP_SUBNORMAL) x = 0.0f;
  const float y = exp2f(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.0f : y;
#elif defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);  // the host pass: never called
#endif
}

// A matrix descriptor with the 128-byte swizzle: start address, leading and stride byte offsets (bytes, multiples
// of 16), base offset 0 (the tiles are 1024-byte aligned).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | static_cast<uint64_t>(lbo >> 4) << 16 |
         static_cast<uint64_t>(sbo >> 4) << 32 | uint64_t{1} << 62;
}
// K-major tile (LBO unused: 16 bytes, what CUTLASS writes) and MN-major tile descriptors, as described above.
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t smem_addr) { return sw128_desc(smem_addr, 16, 1024); }
__device__ __forceinline__ uint64_t mnmajor_desc(uint32_t smem_addr) { return sw128_desc(smem_addr, 1024, 1024); }
// Descriptor d with its start address `bytes` (a multiple of 16) further: one add in place of building it again (the
// 14-bit field does not overflow: shared-window addresses lie under 2^18).
__device__ __forceinline__ uint64_t desc_advance(uint64_t d, uint32_t bytes) { return d + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() {
#ifdef GPT_CUDA_EMULATOR
  emu_warp_converge("wgmma.fence");
#elif defined(GPT_WGMMA_PTX)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef GPT_CUDA_EMULATOR
  emu_wgmma_commit();
#elif defined(GPT_WGMMA_PTX)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifdef GPT_CUDA_EMULATOR
  emu_wgmma_wait(N);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy writes to shared memory (stores, cp.async after its wait) made visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() {
#ifdef GPT_CUDA_EMULATOR
  emu_fence_proxy_async();
#elif defined(GPT_WGMMA_PTX)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#if defined(GPT_WGMMA_PTX)
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
#endif
}
// The A registers of a batch (before its wgmma_fence, as the accumulators: so their writes are not moved past it).
template <int N>
__device__ __forceinline__ void fence_operands(uint32_t (&a)[N][4]) {
#if defined(GPT_WGMMA_PTX)
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[i][r])::"memory");
  }
#endif
}

#if defined(GPT_WGMMA_PTX)
#define GPT_WGMMA_D16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define GPT_WGMMA_D32                                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"
#define GPT_WGMMA_D16_OUT(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define GPT_WGMMA_D32_OUT(d)                                                                                       \
  GPT_WGMMA_D16_OUT(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), \
      "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),      \
      "+f"(d[31])
#define GPT_WGMMA_D64                                                                \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define GPT_WGMMA_D64_OUT(d)                                                                                       \
  GPT_WGMMA_D32_OUT(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
      "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),      \
      "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),      \
      "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),      \
      "+f"(d[63])
#endif

// d = A B (+ d where accumulate), m64nNk16 (N = 32, 64 or 128): A (64 x 16) and B (16 x N) both from shared memory.
// Without the transpose flags both are K-major (B given as its transpose, N rows of K: S = Q K^T with the Q and K
// tiles as they are in memory); kTransA: A MN-major (K rows of M, M = 64: dQ = dS K from the kept dS^T tile);
// kTransB: B MN-major (K rows of N).
template <int N, int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert((N == 32 || N == 64 || N == 128) && (N < 128 || kTransB == 0));  // an MN-major B: one atom wide
#ifdef GPT_CUDA_EMULATOR
  emu_wgmma_m64nNk16(d, N, nullptr, desc_a, kTransA != 0, desc_b, kTransB != 0, accumulate);
#elif defined(GPT_WGMMA_PTX)
  if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " GPT_WGMMA_D64 ", %64, %65, p, 1, 1, %67, %68;\n}\n"
        : GPT_WGMMA_D64_OUT(d)
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GPT_WGMMA_D32 ", %32, %33, p, 1, 1, %35, %36;\n}\n"
        : GPT_WGMMA_D32_OUT(d)
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " GPT_WGMMA_D16 ", %16, %17, p, 1, 1, %19, %20;\n}\n"
        : GPT_WGMMA_D16_OUT(d)
        : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransA), "n"(kTransB));
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// d = A B (+ d where accumulate), m64nNk16 (N = 32, 64 or 128): A (64 x 16) from registers (the layout above), B (16 x
// N) from shared memory, K-major (B given as its transpose, N rows of K: S^T = K Q^T with K held in registers), or with
// kTransB MN-major (K rows of N: O = P V with the V tile as it is in memory).
template <int N, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  static_assert((N == 32 || N == 64 || N == 128) && (N < 128 || kTransB == 0));  // an MN-major B: one atom wide
#ifdef GPT_CUDA_EMULATOR
  emu_wgmma_m64nNk16(d, N, a, 0, false, desc_b, kTransB != 0, accumulate);
#elif defined(GPT_WGMMA_PTX)
  if constexpr (N == 128) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " GPT_WGMMA_D64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : GPT_WGMMA_D64_OUT(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " GPT_WGMMA_D32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : GPT_WGMMA_D32_OUT(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " GPT_WGMMA_D16
        ", {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
        : GPT_WGMMA_D16_OUT(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)), "n"(kTransB));
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
// O = P V's form: N = 64, B MN-major.
__device__ __forceinline__ void wgmma_rs_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  wgmma_rs<64, 1>(d, a, desc_b, accumulate);
}

// A 64 x 64 swizzled tile (K-major: rows = M, 64 columns = K) as the A fragments of its four k-steps, for wgmma_rs:
// a[kk] is k-step kk's (columns 16 kk..), this warp's 16 rows (w: the warp within its warpgroup). Plain 4-byte
// shared loads (a pair never crosses a 16-byte piece; the 8 rows g of a load fall in distinct pieces, so in distinct
// banks). The tile's copies must have landed (cp.async wait and a barrier).
__device__ __forceinline__ void load_a_sw128(uint32_t (&a)[4][4], const unsigned char* tile, int w, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      a[kk][r] = *reinterpret_cast<const uint32_t*>(
          tile + sw128_offset(16 * w + g + 8 * (r % 2), 16 * kk + 2 * tq + 8 * (r / 2)));
    }
  }
}

}  // namespace gpt::cuda
