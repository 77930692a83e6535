// Device helpers shared by the kernel files: index arithmetic and block reductions whose summation order
// depends only on blockDim (so every reduction is deterministic run to run).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "backend/backend.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/tile_order.h"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {

// Whether the environment variable `name` is set to exactly `value` (the CUDA backend's switches: the profile, the
// kernel experiments).
inline bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == value;
}

// Heads per section of the causal attention kernels' tile order (causal_tile, tile_order.h) for `heads` heads of T
// rows with head size hs, `elem` bytes per element: sections whose two tiles a head's blocks all read (K and V, Q and
// dO) fit half of this device's L2; GPT_ATTENTION_ORDER=head gives 0, every head's tiles in turn, as before, and so
// does a grid of 2^32 blocks or more (heads * T bounds it), past causal_tile's 32-bit index arithmetic.
inline int attention_sections(int64_t heads, int T, int hs, size_t elem) {
  if (env_is("GPT_ATTENTION_ORDER", "head") || heads * T >= (int64_t{1} << 32)) return 0;
  int device = 0, l2 = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  return causal_section_heads(heads, 2 * static_cast<int64_t>(T) * hs * static_cast<int64_t>(elem), l2);
}

constexpr int kWarp = 32;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = ceil_div(n, threads);
  return static_cast<unsigned>(blocks < 65535 * 8 ? (blocks > 0 ? blocks : 1) : 65535 * 8);
}

template <typename T>
__device__ inline T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Dropout of element i under `drop` (a DropoutMask): 0 if dropped, else x scaled by keep = 1/(1-p). The one
// expression every kernel with dropout uses, so fused and separate kernels drop and scale alike. __fmul_rn: the
// product is never contracted into an FMA with what the caller adds to it, so it rounds the same in every kernel.
template <typename Mask>
__device__ inline float dropped(float x, const Mask& drop, float keep, int64_t i) {
  return drop.rng.uniform(drop.base + static_cast<uint64_t>(i)) < drop.p ? 0.0f : __fmul_rn(x, keep);
}

// Two fp32 values rounded to bf16 by bf16_bits_nearest (nearest even, subnormals kept, a NaN quieted with its
// payload's top bits) and packed, lo in the low half: the integer code.
__device__ inline uint32_t bf16x2_bits(float lo, float hi) {
  return static_cast<uint32_t>(bf16_bits_nearest(__float_as_uint(lo))) |
         static_cast<uint32_t>(bf16_bits_nearest(__float_as_uint(hi))) << 16;
}
// The same rounding by one cvt.rn.bf16x2.f32 on sm_80 and later: bit for bit bf16x2_bits but for NaN payloads (cvt
// gives the canonical NaN). The attention kernels' P and dS, never NaN.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
#if !defined(GPT_CUDA_EMULATOR) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));  // the first source goes to the upper half
  return r;
#else
  return bf16x2_bits(lo, hi);
#endif
}
// bf16x2_bits' result, NaNs included: the cvt (instead of about six integer operations per value) where neither is
// a NaN. Every kernel's bf16 stores (store4_bf16).
__device__ inline uint32_t bf16x2_nearest(float lo, float hi) {
  return lo != lo || hi != hi ? bf16x2_bits(lo, hi) : pack_bf16x2(lo, hi);
}

// Four fp32 values rounded to bf16 (nearest even: the cast_to_bf16 rounding, bf16x2_nearest) and stored at p: one
// 8-byte store when `vec` (the caller guarantees p is 8-byte aligned and all four lie inside), else one by one, those
// at or past `left` skipped. The bf16 outputs of the kernels that write GEMM inputs.
__device__ inline void store4_bf16(bf16* p, const float (&v)[4], bool vec, int left) {
  uint2 packed;
  packed.x = bf16x2_nearest(v[0], v[1]);
  packed.y = bf16x2_nearest(v[2], v[3]);
  if (vec) {
    *reinterpret_cast<uint2*>(p) = packed;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k < left) p[k].bits = static_cast<uint16_t>((k < 2 ? packed.x : packed.y) >> (16 * (k % 2)));
    }
  }
}

// Four bf16 at p widened to fp32 (exactly bf16_to_f32), one 8-byte load: the caller guarantees p is 8-byte aligned.
// The vectorised read of bf16 parameters (LayerNorm weights and biases, embedding tables).
__device__ inline void load4_bf16(float (&v)[4], const bf16* p) {
  const uint2 t = *reinterpret_cast<const uint2*>(p);
  v[0] = __uint_as_float(t.x << 16);
  v[1] = __uint_as_float(t.x & 0xffff0000u);
  v[2] = __uint_as_float(t.y << 16);
  v[3] = __uint_as_float(t.y & 0xffff0000u);
}

// Four elements at p as fp32, or four fp32 values stored there (bf16 rounded as store4_bf16), one 16-byte (fp32)
// or 8-byte (bf16) access: the caller guarantees p is so aligned (aligned4). For elementwise kernels
// templated on their element types.
__device__ inline void load4_values(float (&v)[4], const float* p) {
  const float4 t = *reinterpret_cast<const float4*>(p);
  v[0] = t.x;
  v[1] = t.y;
  v[2] = t.z;
  v[3] = t.w;
}
__device__ inline void load4_values(float (&v)[4], const bf16* p) { load4_bf16(v, p); }
__device__ inline void store4_values(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void store4_values(bf16* p, const float (&v)[4]) { store4_bf16(p, v, true, 4); }
// Dropout's factor Z for mask element i (offset by drop.base inside): 0 if dropped, else keep = 1/(1-p), as
// `dropped` scales; the attention kernels' P Z.
__device__ inline float dropout_factor(const DropoutMask& drop, float keep, uint64_t i) {
  return drop.rng.uniform(drop.base + i) < drop.p ? 0.0f : keep;
}
// Host side: the keep factor 1/(1-p) the kernels take with a DropoutMask (1 without dropout).
inline float keep_scale(const DropoutMask& drop) { return drop.active() ? 1.0f / (1.0f - drop.p) : 1.0f; }
// Host side: p may be accessed 16 bytes at a time.
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Host side: opts a kernel into `bytes` of dynamic shared memory when past the 48 KB default. Per launch rather
// than once: the attribute belongs to the current device, and this is cheap next to the kernel.
template <class Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return;
  GPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// p may be read or written 4 elements at a time (a float4, or 8 bytes of 4 bf16).
template <typename T>
GPT_HOST_DEVICE inline bool aligned4(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % (4 * sizeof(T)) == 0;
}

// One output element, fp32 or bf16 (rounded as store4_bf16), for kernels templated on their output type.
__device__ inline void store_value(float* p, float v) { *p = v; }
__device__ inline void store_value(bf16* p, float v) { p->bits = bf16_bits_nearest(__float_as_uint(v)); }
// An input element as fp32.
__device__ inline float load_value(const float* p) { return *p; }
__device__ inline float load_value(const bf16* p) { return __uint_as_float(static_cast<uint32_t>(p->bits) << 16); }
// Elements [i, i + 4) of p as fp32: one vector load when `vec` (p aligned to 4 elements) and the group lies below
// n, else one by one, those at or past n read as `fill`. The same values either way, so sums over them do not
// depend on which path ran.
template <typename T>
__device__ inline void load4_upto(float (&v)[4], const T* p, int64_t i, int64_t n, bool vec, float fill) {
  if (vec && i + 4 <= n) {
    load4_values(v, p + i);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = i + k < n ? load_value(p + i + k) : fill;
  }
}
// v into elements [i, i + 4) of p, those at or past n skipped; one vector store under load4_upto's condition.
template <typename T>
__device__ inline void store4_upto(T* p, int64_t i, int64_t n, bool vec, const float (&v)[4]) {
  if (vec && i + 4 <= n) {
    store4_values(p + i, v);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (i + k < n) store_value(p + i + k, v[k]);
    }
  }
}

// Host side: calls f with x's pointer as float* or bf16* (const for a ConstTensorPtr), so a launcher templated on
// the element type is written once and instantiated per dtype.
template <class V, class F>
void with_dtype(BasicTensorPtr<V> x, F&& f) {
  if (x.is_bf16()) {
    f(x.as_bf16());
  } else {
    f(x.as_f32());
  }
}
// The element type behind such a pointer (float or bf16, without const).
template <class P>
using element_t = std::remove_const_t<std::remove_pointer_t<P>>;

// The head sizes the attention kernels are compiled for: f(std::integral_constant<int, D>{}) with the smallest D
// of 32, 64 and 128 that holds hs (REQUIRES hs <= 128).
template <class F>
void with_head_size(int hs, F&& f) {
  if (hs <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (hs <= 64) {
    f(std::integral_constant<int, 64>{});
  } else {
    f(std::integral_constant<int, 128>{});
  }
}

// v rounded to bf16 (nearest even) and back to fp32.
__device__ inline float round_bf16(float v) {
  return __uint_as_float(static_cast<uint32_t>(bf16_bits_nearest(__float_as_uint(v))) << 16);
}

// Deterministic column sums, step 1: the bias gradients of matmul.cu's bias_backward and of gelu.cu's GELU backward
// with the fc bias (which must agree bit for bit). A block of kWarp x kDbiasRowThreads threads takes kDbiasCols
// columns of one chunk of cuda_workspace::kDbiasRows rows (column_partials_grid) and writes partial[chunk * OC + oc],
// the chunk's sum at column oc. Thread (x, y) sums the 4 columns from 4x on over rows lo + y, lo + y + 8, ... in
// order; then the 8 row subsets are added in order. row4(n, oc, v) gives row n's values at columns oc..oc+3 as fp32,
// 0 past OC (it may also write them: gelu.cu stores its result and returns what it stored). sums: the block's
// shared-memory float[kDbiasRowThreads][kDbiasCols]. A thread reads kDbiasBatch rows before it adds them (in row
// order, as one at a time would): one row at a time, each add waiting for its load, kept a single load of 8 or 16
// bytes in flight per thread (an H200 ran bias_backward at 2.2 TB/s where the other streaming kernels ran at 3-4).
constexpr int kDbiasCols = 4 * kWarp;
constexpr int kDbiasRowThreads = 8;
constexpr int kDbiasBatch = 4;
template <class Row4>
__device__ inline void column_partials(float (*sums)[kDbiasCols], float* partial, int64_t N, int OC, Row4&& row4) {
  const int oc = blockIdx.x * kDbiasCols + 4 * threadIdx.x;
  const int64_t lo = static_cast<int64_t>(blockIdx.y) * cuda_workspace::kDbiasRows;
  const int64_t hi = min(N, lo + cuda_workspace::kDbiasRows);
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (oc < OC) {
    for (int64_t n = lo + threadIdx.y; n < hi; n += kDbiasBatch * kDbiasRowThreads) {
      float v[kDbiasBatch][4];
#pragma unroll
      for (int u = 0; u < kDbiasBatch; ++u) {
        if (n + u * kDbiasRowThreads < hi) row4(n + u * kDbiasRowThreads, oc, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kDbiasBatch; ++u) {
        if (n + u * kDbiasRowThreads < hi) {
#pragma unroll
          for (int k = 0; k < 4; ++k) s[k] += v[u][k];
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) sums[threadIdx.y][4 * threadIdx.x + k] = s[k];
  __syncthreads();
  // Thread (x, y) finishes column 32 y + x of the block's 128 (warp y reads one row of sums: no bank conflicts).
  const int col = kWarp * threadIdx.y + threadIdx.x;
  const int out = blockIdx.x * kDbiasCols + col;
  if (col < kDbiasCols && out < OC) {
    float t = 0.0f;
    for (int r = 0; r < kDbiasRowThreads; ++r) t += sums[r][col];
    partial[static_cast<int64_t>(blockIdx.y) * OC + out] = t;
  }
}
// column_partials' grid (its block: dim3(kWarp, kDbiasRowThreads)).
inline dim3 column_partials_grid(int64_t N, int OC) {
  const int64_t chunks = ceil_div(N, cuda_workspace::kDbiasRows);
  GPT_CHECK_MSG(chunks <= 65535, "bias gradient: too many rows for the grid of its column sums");
  return dim3(static_cast<unsigned>(ceil_div(OC, kDbiasCols)), static_cast<unsigned>(chunks));
}

// Sum over the block; every thread gets the result. REQUIRES: blockDim.x a multiple of 32, <= 1024;
// called by all threads of the block. `shared` holds 32 T.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T r = lane < warps ? shared[lane] : T(0);
  return warp_sum(r);
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(r);
}

}  // namespace gpt::cuda
