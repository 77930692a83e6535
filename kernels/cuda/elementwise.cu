// Residual adds with dropout, dropout itself, and the bf16 casts: the twins of kernels/cpu/elementwise.cc
// and of CpuBackend's casts. Dropout draws the same counter-based mask as the CPU (rng.uniform(base + i)),
// so both backends drop the same elements. The casts round to nearest even bit for bit like f32_to_bf16.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {

namespace {

constexpr int kThreads = 256;

template <typename In>
__global__ void residual_kernel(float* out, const float* res, const In* inp, int64_t n, DropoutMask drop, float keep) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load_value(inp + i);
    out[i] = res[i] + (drop.active() ? dropped(x, drop, keep, i) : x);
  }
}

// dst = dropout(src); dst may alias src.
__global__ void dropout_kernel(float* dst, const float* src, int64_t n, DropoutMask drop, float keep) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = dropped(src[i], drop, keep, i);
  }
}

__global__ void to_bf16_kernel(bf16* dst, const float* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i].bits = bf16_bits_nearest(__float_as_uint(src[i]));
  }
}

__global__ void from_bf16_kernel(float* dst, const bf16* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i].bits) << 16);
  }
}

}  // namespace

void residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N, const DropoutMask& drop,
                      cudaStream_t stream) {
  if (N == 0) return;
  with_dtype(inp, [&](auto* x) {
    using In = element_t<decltype(x)>;
    residual_kernel<In><<<grid_for(N, kThreads), kThreads, 0, stream>>>(out, res, x, N, drop, keep_scale(drop));
  });
  GPT_CUDA_CHECK_LAUNCH();
}

void dropout_forward(float* x, int64_t N, const DropoutMask& drop, cudaStream_t stream) {
  if (N == 0 || !drop.active()) return;
  dropout_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(x, x, N, drop, keep_scale(drop));
  GPT_CUDA_CHECK_LAUNCH();
}

void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop, cudaStream_t stream) {
  if (N == 0) return;
  if (!drop.active()) {
    if (dinp != dout) GPT_CUDA_CHECK(cudaMemcpyAsync(dinp, dout, N * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  dropout_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(dinp, dout, N, drop, keep_scale(drop));
  GPT_CUDA_CHECK_LAUNCH();
}

void cast_to_bf16(bf16* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  GPT_CUDA_CHECK_LAUNCH();
}

void cast_from_bf16(float* dst, const bf16* src, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  from_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
