// The synchronisation of warp-specialised kernels as inline PTX (sm_90a, with wgmma_ptx.cuh's kernels): mbarrier
// objects in shared memory (init, arrive, the parity wait, and cp.async's arrive when the thread's copies land),
// named barriers (a barrier over some of the block's warps), and setmaxnreg (a warpgroup hands registers back to, or
// takes them from, the SM's pool). In the CPU emulator (tests/cuda_emu), the shim's emulations (emu_ptx.h).
//
// An mbarrier (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier") is 8 bytes of shared
// memory, 8-byte aligned, initialised by one thread with its arrival count before a barrier over every thread that
// uses it. Its phases complete one after another, each at the count-th arrival; mbarrier_wait(bar, p) returns once
// the phase of parity p has completed, so a consumer of stage s waits with parity (use / stages) % 2, starting at 0,
// and a producer waiting for a stage's release with the parity of the release it needs. The waits are acquires and
// the arrivals releases (their default .release.cta / .acquire.cta semantics).
// cp_async_mbarrier_arrive_noinc: an arrival on `bar` made when every cp.async this thread issued before it has
// landed (.noinc: it counts as one of the count arrivals; a stage filled by a warp's 32 lanes takes count 32).
// Shared memory written by cp.async and read by wgmma after such a wait: the reader's fence_proxy_async() between the
// wait and the products (the generic proxy's writes, made visible by the barrier, then seen by the async proxy).
// Named barriers: bar.sync id, n / bar.arrive id, n: ids 1..15 (0 is __syncthreads'), n a multiple of 32, every
// lane of a warp calling it alike; bar.arrive does not wait (a producer signalling consumers).
// setmaxnreg (sm_90a): every thread of a warpgroup, the same count (24..256, a multiple of 8); dec first in the
// warpgroups giving registers up, inc in those taking them (inc waits until the pool has them: only what the block's
// own decs gave back, so the counts must fit the block's registers at launch).
// Compiled for any other device target, each traps (as wgmma_ptx.cuh's instructions do).
#pragma once

#include <cstdint>

#include "kernels/cuda/wgmma_ptx.cuh"

namespace gpt::cuda {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned count) {
#ifdef GPT_CUDA_EMULATOR
  emu_mbarrier_init(bar, count);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
#ifdef GPT_CUDA_EMULATOR
  emu_mbarrier_arrive(bar);
#elif defined(GPT_WGMMA_PTX)
  asm volatile(
      "{\n"
      ".reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n"
      "}\n" ::"r"(smem_u32(bar))
      : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
#ifdef GPT_CUDA_EMULATOR
  emu_mbarrier_wait(bar, parity);
#elif defined(GPT_WGMMA_PTX)
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ void cp_async_mbarrier_arrive_noinc(uint64_t* bar) {
#ifdef GPT_CUDA_EMULATOR
  emu_cp_async_mbarrier_arrive_noinc(bar);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
#ifdef GPT_CUDA_EMULATOR
  emu_named_barrier(id, threads, true);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ void named_barrier_arrive(unsigned id, unsigned threads) {
#ifdef GPT_CUDA_EMULATOR
  emu_named_barrier(id, threads, false);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0);
#ifdef GPT_CUDA_EMULATOR
  emu_setmaxnreg(N);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(N >= 24 && N <= 256 && N % 8 == 0);
#ifdef GPT_CUDA_EMULATOR
  emu_setmaxnreg(N);
#elif defined(GPT_WGMMA_PTX)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

}  // namespace gpt::cuda
