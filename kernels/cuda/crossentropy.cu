// Fused softmax + cross-entropy (+ its gradient) on the GPU, the twin of kernels/cpu/crossentropy.cc. One
// block per row: one read pass over the V real logits keeps an online max and sum per thread, block
// reductions combine them, then one pass writes dlogits; no probability matrix is stored. Deterministic:
// each thread owns fixed groups of 4 consecutive columns (counted from the row start, whatever the row's
// alignment, so a float4 load and 4 scalar loads feed the same sums in the same order) and the block
// reductions' order depends only on blockDim. A thread loads kUnroll of its groups before it uses the first, so
// that many loads are in flight per thread (one, before, behind the running max): a streaming kernel wants some
// 20-30 KB in flight per multiprocessor to keep HBM busy (Little's law at ~4 TB/s and ~700 ns), where 2048 threads
// with one 8-byte bf16 load each held 16 KB; three blocks of 512 threads with four each hold 48 KB (ptxas, sm_90:
// 40 registers with the kernel bounded to 3 such blocks per multiprocessor, no spills). The groups are still taken
// in the same order, so the sums are the same, bit for bit.
// GPT_CE_ROW_IN_SMEM=1 (an experiment, not yet measured on a GPU): where a bf16 row fits (V * 2 bytes up to
// kRowSmemMax: two blocks per multiprocessor), the first pass also keeps the row in shared memory and the dlogits
// pass reads it there, so a row is read from HBM once, not twice where L2 no longer holds it (at GPT-2's 50304
// columns 3 blocks x 132 SMs stream 40 MB of rows, and the dlogits as much, through an L2 of 50); the same values,
// bit for bit (each thread rereads its own groups, stored as loaded).
#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "core/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {
namespace {

constexpr int kThreads = 512;          // per block (one row); a multiple of 32, as block_max/block_sum require
constexpr int kUnroll = 4;             // groups of 4 columns a thread has in flight: a stride of 4 * kThreads * kUnroll
constexpr int kStride = 4 * kThreads;  // from one of a thread's groups to its next
constexpr size_t kRowSmemMax = 110 * 1024;  // two blocks per multiprocessor (227 KB for one on sm_90)

// Groups j, j + kStride, ... (kUnroll of them) of row z as load4_upto reads them: every load issued before any value
// is used. Elements at or past n are `fill`, and not loaded.
template <typename In>
__device__ inline void load_groups(float (&v)[kUnroll][4], const In* z, int j, int n, bool vec, float fill) {
  if (vec && j + kStride * (kUnroll - 1) + 4 <= n) {  // all inside the row: plain vector loads
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load4_values(v[u], z + j + u * kStride);
  } else {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) load4_upto(v[u], z, j + u * kStride, n, vec, fill);
  }
}

// logits and dlogits of one dtype may be the same memory (no __restrict__): every logit a thread reads in the
// dlogits pass is one it alone writes, after reading it; z[target] and the row statistics are read before the
// block reductions' __syncthreads, so before any thread writes. In (logits) and Out (dlogits): float or bf16 (the
// fp32 gradient rounded at the store). kRowInSmem: the row's V logits kept in the dynamic shared memory by the first
// pass (each thread its own groups, as loaded) for the second (GPT_CE_ROW_IN_SMEM).
template <typename In, typename Out, bool kRowInSmem>
__global__ void __launch_bounds__(kThreads, kRowInSmem ? 2 : 3)
    crossentropy_kernel(float* __restrict__ losses, Out* dlogits, const In* logits, const int32_t* __restrict__ targets,
                        int V, int Vp, float dloss) {
  __shared__ float shared[kWarp];
  extern __shared__ __align__(16) unsigned char row_raw[];
  In* srow = reinterpret_cast<In*>(row_raw);  // kRowInSmem: V elements, 16-byte aligned
  const int64_t i = blockIdx.x;
  const In* z = logits + i * Vp;
  const int y = targets[i];
  const float zy = threadIdx.x == 0 ? load_value(z + y) : 0.0f;  // only thread 0 writes the loss
  const bool z_vec = aligned4(z);

  // Online max/sum. m starts at -FLT_MAX rather than -inf so that a -inf logit adds exp(-inf) = 0 instead of
  // exp(-inf - -inf) = NaN; missing elements of the last group are -inf for the same reason.
  // A group wholly past V is all -inf: it changes neither m nor s, as if the loop had stopped before it.
  float m = -FLT_MAX, s = 0.0f;
  for (int j0 = 4 * threadIdx.x; j0 < V; j0 += kStride * kUnroll) {
    float v[kUnroll][4];
    load_groups(v, z, j0, V, z_vec, -INFINITY);
    if constexpr (kRowInSmem) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) store4_upto(srow, j0 + u * kStride, V, true, v[u]);  // exact: In's values
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float gm = fmaxf(fmaxf(v[u][0], v[u][1]), fmaxf(v[u][2], v[u][3]));
      if (gm > m) {  // rescale the running sum to the new max
        s *= expf(m - gm);
        m = gm;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) s += expf(v[u][k] - m);
    }
  }
  const float maxv = block_max(m, shared);
  const float sum = block_sum(s * expf(m - maxv), shared);  // a thread with no elements has s = 0
  if (threadIdx.x == 0) losses[i] = (maxv + logf(sum)) - zy;
  if (dlogits == nullptr) return;  // uniform over the block

  // dlogits = softmax * dloss, minus dloss at the target, zero over the padding [V, Vp).
  const float inv = 1.0f / sum;
  Out* dz = dlogits + i * Vp;
  const bool dz_vec = aligned4(dz);
  for (int j0 = 4 * threadIdx.x; j0 < Vp; j0 += kStride * kUnroll) {
    float v[kUnroll][4];
    if constexpr (kRowInSmem) {
      load_groups(v, static_cast<const In*>(srow), j0, V, true, 0.0f);  // this thread's own stores
    } else {
      load_groups(v, z, j0, V, z_vec, 0.0f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int j = j0 + u * kStride;
      float g[4];
      if (j + 4 <= V && (y < j || y >= j + 4)) {  // nearly every group: all real columns, not the target's
#pragma unroll
        for (int k = 0; k < 4; ++k) g[k] = expf(v[u][k] - maxv) * inv * dloss;
      } else {  // the same values, with the padding's zeros and the target's -dloss
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          g[k] = j + k < V ? expf(v[u][k] - maxv) * inv * dloss : 0.0f;
          if (j + k == y) g[k] -= dloss;
        }
      }
      store4_upto(dz, j, Vp, dz_vec, g);  // a group at or past Vp stores nothing
    }
  }
}

// A bf16 row's bytes in shared memory (V rounded up to 16 bytes) where they fit two blocks per multiprocessor
// (kRowSmemMax) and, beside the block's static reduction buffer, this device's shared memory per block (99 KB on
// sm_86/89, 163 on sm_80, 227 on sm_90); else 0.
size_t row_smem_bytes(int V) {
  const size_t bytes = (static_cast<size_t>(V) * sizeof(bf16) + 15) / 16 * 16;
  if (bytes > kRowSmemMax) return 0;
  int device = 0, optin = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes + sizeof(float) * kWarp <= static_cast<size_t>(optin) ? bytes : 0;
}

// smem: the dynamic shared memory (kRowInSmem: row_smem_bytes). Its opt-in is set whatever its size: the static
// 128 bytes count against the 48 KB a block gets without it.
template <typename In, typename Out, bool kRowInSmem>
void launch_kernel(float* losses, Out* dlogits, const In* logits, const int32_t* targets, int64_t N, int V, int Vp,
                   float dloss, size_t smem, cudaStream_t stream) {
  const auto kernel = crossentropy_kernel<In, Out, kRowInSmem>;
  if (kRowInSmem) {
    GPT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  kernel<<<static_cast<unsigned>(N), kThreads, smem, stream>>>(losses, dlogits, logits, targets, V, Vp, dloss);
}

template <typename In, typename Out>
void launch_crossentropy(float* losses, Out* dlogits, const In* logits, const int32_t* targets, int64_t N, int V,
                         int Vp, float dloss, cudaStream_t stream) {
  if constexpr (std::is_same_v<In, bf16>) {  // an fp32 row would take twice the room: one block per multiprocessor
    if (dlogits != nullptr && env_is("GPT_CE_ROW_IN_SMEM", "1")) {
      if (const size_t smem = row_smem_bytes(V); smem > 0) {
        launch_kernel<In, Out, true>(losses, dlogits, logits, targets, N, V, Vp, dloss, smem, stream);
        return;
      }
    }
  }
  launch_kernel<In, Out, false>(losses, dlogits, logits, targets, N, V, Vp, dloss, 0, stream);
}

template <typename In>
void launch_crossentropy(float* losses, TensorPtr dlogits, const In* logits, const int32_t* targets, int64_t N, int V,
                         int Vp, float dloss, cudaStream_t stream) {
  if (dlogits.is_bf16()) {
    launch_crossentropy(losses, dlogits.as_bf16(), logits, targets, N, V, Vp, dloss, stream);
  } else {
    launch_crossentropy(losses, dlogits.as_f32(), logits, targets, N, V, Vp, dloss, stream);
  }
}

}  // namespace

void crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss, cudaStream_t stream) {
  GPT_CHECK(N >= 0 && V > 0 && Vp >= V);
  GPT_CHECK(Vp <= INT32_MAX - kStride * kUnroll);  // the column loops' int index cannot overflow
  GPT_CHECK(N <= INT32_MAX);                       // one block per row
  GPT_CHECK(losses != nullptr && logits.data != nullptr && targets != nullptr);
  // In place (same memory, same dtype) is allowed; any other overlap is not (rows would overwrite other rows
  // before they are read).
  if (dlogits.data != nullptr && !(dlogits.data == logits.data && dlogits.dtype == logits.dtype)) {
    const auto d = reinterpret_cast<uintptr_t>(dlogits.data), l = reinterpret_cast<uintptr_t>(logits.data);
    const auto n = static_cast<uintptr_t>(N) * Vp;
    GPT_CHECK(d + n * dtype_size(dlogits.dtype) <= l || l + n * dtype_size(logits.dtype) <= d);
  }
  if (N == 0) return;
  with_dtype(logits, [&](auto* z) { launch_crossentropy(losses, dlogits, z, targets, N, V, Vp, dloss, stream); });
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
