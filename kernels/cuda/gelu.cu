// GELU, tanh approximation (GPT-2): the twin of kernels/cpu/gelu.cc.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCube = 0.044715f;

// In, Out: float or bf16 (a bf16 output is the same fp32 value rounded at the store, as cast_to_bf16 rounds).
template <typename In, typename Out>
__global__ void gelu_forward_kernel(Out* out, const In* inp, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load_value(inp + i);
    store_value(out + i, 0.5f * x * (1.0f + tanhf(kScale * (x + kCube * x * x * x))));
  }
}

template <typename In, typename Out>
void launch_forward(Out* out, const In* inp, int64_t n, cudaStream_t stream) {
  gelu_forward_kernel<In, Out><<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, inp, n);
}

// dinp may alias dout when both are fp32 (the model does that under fp32 compute).
template <typename In, typename Out>
__global__ void gelu_backward_kernel(Out* dinp, const In* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load_value(inp + i);
    const float th = tanhf(kScale * (x + kCube * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCube * x * x);
    store_value(dinp + i, grad * dout[i]);
  }
}

template <typename In, typename Out>
void launch_backward(Out* dinp, const In* inp, const float* dout, int64_t n, cudaStream_t stream) {
  gelu_backward_kernel<In, Out><<<grid_for(n, kThreads), kThreads, 0, stream>>>(dinp, inp, dout, n);
}

}  // namespace

void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  with_dtype(inp, [&](auto* x) { with_dtype(out, [&](auto* y) { launch_forward(y, x, N, stream); }); });
  GPT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, const float* dout, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  with_dtype(inp, [&](auto* x) { with_dtype(dinp, [&](auto* dx) { launch_backward(dx, x, dout, N, stream); }); });
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
