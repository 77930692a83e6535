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

// gelu_backward_kernel over N rows of C as column_partials' blocks (4 columns by a strided set of rows per thread),
// each thread summing the values it stored (rounded, for a bf16 dinp): the fc bias's gradient partials. vec: every
// row's groups of 4 aligned (C % 4 == 0 and aligned bases); columns past C add 0.
template <typename In, typename Grad, typename Out>
__global__ void gelu_backward_bias_kernel(Out* dinp, float* partial, const In* inp, const Grad* dout, int64_t N, int C,
                                          bool vec) {
  __shared__ float sums[kDbiasRowThreads][kDbiasCols];
  column_partials(sums, partial, N, C, [&](int64_t n, int c, float(&v)[4]) {
    const int64_t row = n * C;
    float x[4], dy[4];
    load4_upto(x, inp + row, c, C, vec, 0.0f);
    load4_upto(dy, dout + row, c, C, vec, 0.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float dx = __fmul_rn(gelu_grad(x[k]), dy[k]);  // rounded as stored: no FMA into the sum below
      v[k] = c + k < C ? (std::is_same_v<Out, bf16> ? round_bf16(dx) : dx) : 0.0f;
    }
    store4_upto(dinp + row, c, C, vec, v);  // a rounded value stores as itself
  });
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

void gelu_backward_bias(TensorPtr dinp, float* dbias, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N, int C,
                        void* scratch, cudaStream_t stream) {
  GPT_CHECK(N >= 0 && C > 0 && dbias != nullptr);
  if (N == 0) return;
  GPT_CHECK(scratch != nullptr);
  auto* partial = static_cast<float*>(scratch);
  const dim3 grid = column_partials_grid(N, C);
  with_dtype(inp, [&](auto* x) {
    with_dtype(dout, [&](auto* dy) {
      with_dtype(dinp, [&](auto* dx) {
        using In = element_t<decltype(x)>;
        using Grad = element_t<decltype(dy)>;
        using Out = element_t<decltype(dx)>;
        const bool vec = C % 4 == 0 && aligned4(dx) && aligned4(x) && aligned4(dy);
        gelu_backward_bias_kernel<In, Grad, Out>
            <<<grid, dim3(kWarp, kDbiasRowThreads), 0, stream>>>(dx, partial, x, dy, N, C, vec);
      });
    });
  });
  GPT_CUDA_CHECK_LAUNCH();
  bias_backward_sum(dbias, partial, N, C, stream);
}

}  // namespace gpt::cuda
