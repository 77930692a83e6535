#include <string>

#include "comm/device_select.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kernels.h"

namespace gpt {

namespace {

// At process exit the runtime may already be unloading; the memory goes with the process then.
void cuda_free(void* p) {
  const cudaError_t err = cudaFree(p);
  if (err != cudaErrorCudartUnloading) GPT_CUDA_CHECK(err);
}

}  // namespace

Expected<std::unique_ptr<Backend>> make_cuda_backend(int local_rank, int local_size) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return Status::failed_precondition(std::string("device 'cuda': no CUDA device is visible (") +
                                       cudaGetErrorString(err) + ")");
  }
  auto device = device_for_local_rank(local_rank, local_size, count);
  if (!device) return device.status().with_context("device 'cuda'");
  return std::unique_ptr<Backend>(std::make_unique<CudaBackend>(*device));
}

CudaBackend::CudaBackend(int device) : device_(device) {
  GPT_CUDA_CHECK(cudaSetDevice(device_));
  GPT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  matmul_ = std::make_unique<cuda::Matmul>(stream_);
  result_ = alloc(sizeof(double), MemCategory::kWorkspace);
  GPT_CUDA_CHECK(cudaMallocHost(&result_host_, sizeof(double)));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  scratch_.release();
  result_.release();
  matmul_.reset();
  cudaFreeHost(result_host_);
  cudaStreamDestroy(stream_);
}

Buffer CudaBackend::alloc(size_t bytes, MemCategory category) {
  if (bytes == 0) return Buffer();
  void* p = nullptr;
  const size_t rounded = (bytes + 255) / 256 * 256;
  GPT_CUDA_CHECK(cudaMalloc(&p, rounded));
  GPT_CUDA_CHECK(cudaMemsetAsync(p, 0, rounded, stream_));
  return Buffer::adopt(p, bytes, category, cuda_free);
}

void* CudaBackend::scratch(size_t bytes) {
  if (scratch_.bytes() < bytes) {
    GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old area may still be in use by queued kernels
    scratch_.release();
    scratch_ = alloc(bytes, MemCategory::kWorkspace);
  }
  return scratch_.data();
}

void CudaBackend::to_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::to_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() { GPT_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                                    int C) {
  cuda::embedding_forward(out, tokens, wte, wpe, B, T, C, stream_);
}
void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                     int C) {
  cuda::embedding_backward(dwte, dwpe, dout, tokens, B, T, C, scratch(cuda::embedding_backward_scratch_bytes(B, T)),
                           stream_);
}
void CudaBackend::matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C,
                                 int OC) {
  matmul_->forward(out, inp, weight, bias, N, C, OC);
}
void CudaBackend::matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, int64_t N, int C, int OC) {
  void* s = dbias != nullptr ? scratch(cuda::Matmul::backward_scratch_bytes(N, OC)) : nullptr;
  matmul_->backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, s);
}
void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                    const float* bias, int64_t N, int C) {
  cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream_);
}
void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                     const float* weight, const float* mean, const float* rstd, int64_t N, int C) {
  cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                           scratch(cuda::layernorm_backward_scratch_bytes(N, C)), stream_);
}
void CudaBackend::attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH,
                                    const DropoutMask& drop) {
  cuda::attention_forward(out, att, qkv, B, T, C, NH, drop, stream_);
}
void CudaBackend::attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                                     const float* att, int B, int T, int C, int NH, const DropoutMask& drop) {
  cuda::attention_backward(dqkv, dout, qkv, out, att, B, T, C, NH, drop,
                           scratch(cuda::attention_backward_scratch_bytes(B, T, C, NH)), stream_);
}
void CudaBackend::gelu_forward(float* out, const float* inp, int64_t N) { cuda::gelu_forward(out, inp, N, stream_); }
void CudaBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t N) {
  cuda::gelu_backward(dinp, inp, dout, N, stream_);
}
void CudaBackend::residual_forward(float* out, const float* res, const float* inp, int64_t N, const DropoutMask& drop) {
  cuda::residual_forward(out, res, inp, N, drop, stream_);
}
void CudaBackend::dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) {
  cuda::dropout_backward(dinp, dout, N, drop, stream_);
}
void CudaBackend::dropout_forward(float* x, int64_t N, const DropoutMask& drop) {
  cuda::dropout_forward(x, N, drop, stream_);
}
void CudaBackend::crossentropy_forward_backward(float* losses, float* dlogits, const float* logits,
                                                const int32_t* targets, int64_t N, int V, int Vp, float dloss) {
  cuda::crossentropy_forward_backward(losses, dlogits, logits, targets, N, V, Vp, dloss, stream_);
}
void CudaBackend::adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                               float beta2, float eps, float weight_decay, float grad_scale, int64_t step) {
  cuda::adamw_update(param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, step, stream_);
}
double CudaBackend::sum_squares(const float* x, int64_t n) {
  cuda::sum_squares(result_.as<double>(), x, n, scratch(cuda::sum_squares_scratch_bytes()), stream_);
  GPT_CUDA_CHECK(cudaMemcpyAsync(result_host_, result_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *result_host_;
}
void CudaBackend::fill_zero(float* x, int64_t n) {
  if (n > 0) GPT_CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(float), stream_));
}
void CudaBackend::cast_to_bf16(bf16* dst, const float* src, int64_t n) { cuda::cast_to_bf16(dst, src, n, stream_); }
void CudaBackend::cast_from_bf16(float* dst, const bf16* src, int64_t n) { cuda::cast_from_bf16(dst, src, n, stream_); }
void CudaBackend::copy(float* dst, const float* src, int64_t n) {
  if (n > 0) GPT_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

}  // namespace gpt
