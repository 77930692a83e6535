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

// dinp may alias dout (the model does that).
template <typename In>
__global__ void gelu_backward_kernel(float* dinp, const In* inp, const float* dout, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = load_value(inp + i);
    const float th = tanhf(kScale * (x + kCube * x * x * x));
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCube * x * x);
    dinp[i] = grad * dout[i];
  }
}

}  // namespace

void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  if (inp.is_bf16()) {
    if (out.is_bf16()) {
      launch_forward(out.as_bf16(), inp.as_bf16(), N, stream);
    } else {
      launch_forward(out.as_f32(), inp.as_bf16(), N, stream);
    }
  } else if (out.is_bf16()) {
    launch_forward(out.as_bf16(), inp.as_f32(), N, stream);
  } else {
    launch_forward(out.as_f32(), inp.as_f32(), N, stream);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(float* dinp, ConstTensorPtr inp, const float* dout, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  if (inp.is_bf16()) {
    gelu_backward_kernel<bf16><<<grid_for(N, kThreads), kThreads, 0, stream>>>(dinp, inp.as_bf16(), dout, N);
  } else {
    gelu_backward_kernel<float><<<grid_for(N, kThreads), kThreads, 0, stream>>>(dinp, inp.as_f32(), dout, N);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
