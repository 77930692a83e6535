// GELU, tanh approximation (GPT-2): the twin of kernels/cpu/gelu.cc.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCube = 0.044715f;

__device__ inline float gelu(float x) { return 0.5f * x * (1.0f + tanhf(kScale * (x + kCube * x * x * x))); }

__device__ inline float gelu_grad(float x) {
  const float th = tanhf(kScale * (x + kCube * x * x * x));
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCube * x * x);
}

// Each thread takes groups of 4 consecutive elements: one vector load and store per tensor where every pointer is
// aligned to 4 elements (`vec`), else (and for the last, partial group) element by element (load4_upto,
// store4_upto). The kernels are memory-bound, and 2-byte accesses (bf16) would leave most of the bandwidth unused.
// In, Out: float or bf16 (a bf16 output is the same fp32 value rounded at the store, as cast_to_bf16 rounds).
template <typename In, typename Out>
__global__ void gelu_forward_kernel(Out* out, const In* inp, int64_t n, bool vec) {
  for (int64_t i = 4 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x); i < n;
       i += 4 * static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[4], y[4];
    load4_upto(x, inp, i, n, vec, 0.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) y[k] = gelu(x[k]);
    store4_upto(out, i, n, vec, y);
  }
}

template <typename In, typename Out>
void launch_forward(Out* out, const In* inp, int64_t n, cudaStream_t stream) {
  const bool vec = aligned4(out) && aligned4(inp);
  gelu_forward_kernel<In, Out><<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, stream>>>(out, inp, n, vec);
}

// dinp may alias dout of its dtype (the model does that where the GELU's output gradient is in the GEMM input
// dtype): a thread reads its group of dout before it writes the same group of dinp.
template <typename In, typename Grad, typename Out>
__global__ void gelu_backward_kernel(Out* dinp, const In* inp, const Grad* dout, int64_t n, bool vec) {
  for (int64_t i = 4 * (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x); i < n;
       i += 4 * static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[4], dy[4], dx[4];
    load4_upto(x, inp, i, n, vec, 0.0f);
    load4_upto(dy, dout, i, n, vec, 0.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) dx[k] = gelu_grad(x[k]) * dy[k];
    store4_upto(dinp, i, n, vec, dx);
  }
}

template <typename In, typename Grad, typename Out>
void launch_backward(Out* dinp, const In* inp, const Grad* dout, int64_t n, cudaStream_t stream) {
  const bool vec = aligned4(dinp) && aligned4(inp) && aligned4(dout);
  gelu_backward_kernel<In, Grad, Out>
      <<<grid_for(ceil_div(n, 4), kThreads), kThreads, 0, stream>>>(dinp, inp, dout, n, vec);
}

}  // namespace

void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  with_dtype(inp, [&](auto* x) { with_dtype(out, [&](auto* y) { launch_forward(y, x, N, stream); }); });
  GPT_CUDA_CHECK_LAUNCH();
}

void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N, cudaStream_t stream) {
  if (N == 0) return;
  with_dtype(inp, [&](auto* x) {
    with_dtype(dout, [&](auto* dy) { with_dtype(dinp, [&](auto* dx) { launch_backward(dx, x, dy, N, stream); }); });
  });
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
