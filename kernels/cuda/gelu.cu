// GELU, tanh approximation (GPT-2): the twin of kernels/cpu/gelu.cc.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCube = 0.044715f;

__device__ inline void store(float* p, float v) { *p = v; }
__device__ inline void store(bf16* p, float v) { p->bits = bf16_bits_nearest(__float_as_uint(v)); }

// Out: float, or bf16 (the same fp32 value rounded at the store, as cast_to_bf16 rounds).
template <typename Out>
__global__ void gelu_forward_kernel(Out* out, const float* inp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    store(out + i, 0.5f * x * (1.0f + tanhf(kScale * (x + kCube * x * x * x))));
  }
}

// dinp may alias dout (the model does that).
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = inp[i];
    const float th = tanhf(kScale * (x + kCube * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCube * x * x);
    dinp[i] = grad * dout[i];
  }
}

}  // namespace

void gelu_forward(TensorPtr out, const float* inp, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  if (out.is_bf16()) {
    gelu_forward_kernel<bf16><<<grid_for(N, kThreads), kThreads, 0, stream>>>(out.as_bf16(), inp, N);
  } else {
    gelu_forward_kernel<float><<<grid_for(N, kThreads), kThreads, 0, stream>>>(out.as_f32(), inp, N);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  gelu_backward_kernel<<<grid_for(N, kThreads), kThreads, 0, stream>>>(dinp, inp, dout, N);
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
