// AdamW over a flat fp32 shard and the sum of squares for the global gradient norm: the twins of
// adamw_update and sum_squares in kernels/cpu/elementwise.cc. The bias corrections are computed on the host
// exactly as the CPU does. sum_squares is deterministic: a fixed grid of blocks, each thread striding with
// a fixed stride, partial sums in double written per block, then one block adding them in block order.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace gpt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = 256;  // fixed, so the summation order never depends on the GPU

__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    param[i] -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * param[i]);
  }
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    s += static_cast<double>(x[i]) * x[i];
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials_kernel(double* result, const double* partial, int count) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) *result = s;
}

}  // namespace

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int64_t step, cudaStream_t stream) {
  GPT_CHECK(step >= 1);
  if (n == 0) return;
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, m, v, grad, n, lr, beta1, beta2, eps,
                                                               weight_decay, grad_scale, bc1, bc2);
  GPT_CUDA_CHECK_LAUNCH();
}

size_t sum_squares_scratch_bytes() { return kSumBlocks * sizeof(double); }

void sum_squares(double* result, const float* x, int64_t n, void* scratch, cudaStream_t stream) {
  auto* partial = static_cast<double*>(scratch);
  sum_squares_partial_kernel<<<kSumBlocks, kThreads, 0, stream>>>(partial, x, n);
  GPT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(result, partial, kSumBlocks);
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
