// CudaBackend: the Backend on one GPU. Every op is queued on the backend's own stream (in call order) and
// returns at once; to_host, sum_squares and synchronize wait. to_device waits only for the copy four pieces back
// (pinned staging, 4 MiB pieces); a to_host of more than one piece goes through the same slots. Memory comes from
// cudaMalloc through Buffer::adopt, so it is counted by the same categories as on the CPU; kernels that need
// temporaries share one scratch area that grows to the largest request (the first training step sizes it; no allocation
// after that). Not thread-safe: one training thread drives it.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <deque>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "kernels/cuda/kernels.h"

namespace gpt {

namespace cuda {
class Matmul;
}  // namespace cuda

class CudaBackend final : public Backend {
 public:
  // REQUIRES: `device` is a valid CUDA device index.
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  Buffer alloc(size_t bytes, MemCategory category) override;
  void set_threads(int /*threads*/) override {}
  bool host_memory() const override { return false; }
  void to_device(void* dst, const void* src, size_t bytes) override;
  void to_host(void* dst, const void* src, size_t bytes) override;
  void synchronize() override;
  void reserve(int B, int T, int C, int NH, int V, int64_t head_rows, bool dropout) override;
  int device_index() const override { return device_; }
  double peak_flops() const override;
  std::optional<DeviceMemory> device_memory() const override;
  void* native_stream() const override { return stream_; }
  void set_compute_dtype(DType type) override;
  DType compute_dtype() const override { return compute_dtype_; }
  Status set_gelu_fusion(GeluFusion fusion) override;
  Status set_attention_kernel(AttentionKernel kernel) override;
  bool gelu_backward_fused(int C) const override;

  void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B, int T,
                         int C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                          int C) override;
  using Backend::matmul_backward;  // the unpadded overloads
  using Backend::matmul_forward;
  void matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                      int OC, int64_t ld_out) override;
  void matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                       ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) override;
  void bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) override;
  void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                         ConstTensorPtr bias, int64_t N, int C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                          ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                          bf16* dinp_lo) override;
  void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                  ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                                  const DropoutMask& drop) override;
  int64_t attention_state_floats(int B, int T, int NH) const override {
    return static_cast<int64_t>(B) * NH * T;  // each query row's log-sum-exp
  }
  void attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                         const DropoutMask& drop) override;
  void attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* att,
                          int B, int T, int C, int NH, const DropoutMask& drop, float* dqkv_bias) override;
  void attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) override;
  void matmul_gelu_forward(TensorPtr pre, TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias,
                           int64_t N, int C, int OC) override;
  void matmul_backward_gelu(TensorPtr dpre, float* dpre_bias, TensorPtr dinp, float* dweight, float* dbias,
                            ConstTensorPtr dout, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr pre,
                            int64_t N, int C, int OC) override;
  void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) override;
  void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) override;
  void residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N, const DropoutMask& drop) override;
  void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) override;
  void dropout_forward(float* x, int64_t N, const DropoutMask& drop) override;
  void crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits, const int32_t* targets,
                                     int64_t N, int V, int Vp, float dloss) override;
  void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale, int64_t step) override;
  void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                          const std::vector<OptimSpan>& spans, const AdamWStep& step,
                          const Bf16Rounding& rounding) override;
  double sum_squares(const float* x, int64_t n) override;
  double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) override;
  void round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                           const Bf16Rounding& rounding) override;
  void fill_zero(float* x, int64_t n) override;
  void cast_to_bf16(bf16* dst, const float* src, int64_t n) override;
  void cast_from_bf16(float* dst, const bf16* src, int64_t n) override;
  void copy(float* dst, const float* src, int64_t n) override;
  std::string profile_report() const override;
  void profile_restart() override;

 private:
  // Under GPT_TRAIN_CUDA_PROFILE=1 every op records a CUDA event on the stream before and after itself, without
  // waiting: the ops run back to back as in an unprofiled run, and each op's time is the device time between its
  // two events. The times are read where the host waits for the stream anyway (synchronize, to_host, the report)
  // or when the event pool is full. Otherwise a no-op.
  // An op's least work, for the report's rates: the floating-point operations of its products (GEMMs, attention), or
  // else the bytes it must move (each tensor it reads or writes, once; its own temporaries not counted).
  struct OpWork {
    double flops, bytes;
  };
  // A GEMM's rows, input and output widths (N, C, OC): the report keeps each shape apart ("matmul_forward_N_C_OC").
  using OpShape = std::array<int64_t, 3>;
  class OpTimer {
   public:
    OpTimer(CudaBackend* be, const char* op, OpWork work, OpShape shape = {});
    ~OpTimer();
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

   private:
    CudaBackend* be_;
    const char* op_;
    OpWork work_;
    OpShape shape_;
    size_t start_ = 0;  // its first event's index in op_events_
  };
  OpTimer time_op(const char* op, OpWork work = {0.0, 0.0}, OpShape shape = {}) {
    return OpTimer(profile_ ? this : nullptr, op, work, shape);
  }
  static OpWork flop_work(double flops) { return OpWork{flops, 0.0}; }
  static OpWork byte_work(int64_t bytes) { return OpWork{0.0, static_cast<double>(bytes)}; }
  void* scratch(size_t bytes);
  const cuda::SpanTable& span_table(const std::vector<OptimSpan>& spans);
  // bf16 copies of a GEMM's fp32 inputs: slot 0 inp, 1 weight, 2 dout, 3 the bias as the output's dtype wants it
  // (gemm_bias: rounded to bf16, or a bf16 one widened to fp32 in twice the elements).
  bf16* cast_area(int slot, int64_t n);
  // A bf16 GEMM operand of n elements: x itself when bf16, else x cast into cast area `slot`.
  const bf16* gemm_input(int slot, ConstTensorPtr x, int64_t n);
  // A GEMM's bias as Matmul takes it for an output of `out_type` (null for none); may use cast area 3.
  const void* gemm_bias(ConstTensorPtr bias, DType out_type, int OC);
  // Which attention kernels take these tensors (qkv, out, dqkv; the backward's dout, of either dtype), from the compute
  // dtype, the shape, the tensors' dtypes and alignment, run.attention_kernel, and the shared memory a block may have
  // on this GPU (the first time a choice is given up for that, a warning says so).
  enum class AttentionPath { kFp32, kWmma, kMma };
  AttentionPath attention_path(int C, int NH, std::initializer_list<ConstTensorPtr> tensors,
                               const void* dout = nullptr) const;
  // Whether a GELU epilogue takes these: at least `level` fusion asked for, bf16 compute, the GELU's input and
  // output bf16 and 16-byte aligned, `rows` (the GELU's width) a multiple of 8.
  bool gelu_fused(GeluFusion level, int64_t rows, std::initializer_list<ConstTensorPtr> gelu_tensors) const;

  int device_;
  size_t smem_per_block_ = 0;  // the most dynamic shared memory a block may opt into on this GPU
  mutable bool attention_fallback_logged_ = false;
  cudaStream_t stream_ = nullptr;
  Buffer cublas_workspace_;  // cuBLASLt's (workspace), before matmul_ so that it outlives it
  // GPT_GEMM_WGRAD_STREAM=1 (cuda_workspace::wgrad_stream_enabled): the weight gradients' stream and cuBLASLt
  // workspace (Matmul's side lane); null otherwise.
  cudaStream_t wgrad_stream_ = nullptr;
  Buffer wgrad_workspace_;
  std::unique_ptr<cuda::Matmul> matmul_;
  Buffer scratch_;  // shared temporaries (workspace), grown to the largest request
  Buffer cast_[4];  // bf16 GEMM inputs (workspace), grown to the largest request
  struct SpanTableEntry {
    std::vector<OptimSpan> spans;
    Buffer memory;  // workspace
    cuda::SpanTable table;
  };
  std::deque<SpanTableEntry> span_tables_;  // one per distinct list of spans (stable references)
  DType compute_dtype_ = DType::kF32;
  GeluFusion gelu_fusion_ = GeluFusion::kNone;
  AttentionKernel attention_kernel_ = AttentionKernel::kAuto;
  Buffer result_;                  // one double on the device for sum_squares
  double* result_host_ = nullptr;  // pinned
  // to_device's staging: a cudaMemcpyAsync from pageable memory may wait for the stream to reach the copy (CUDA
  // stages it itself, and may synchronize), which would stall the host at every micro-batch's token and target
  // uploads, and is not documented to have read its source when it returns. Every upload is copied into the next
  // of these pinned slots instead, in pieces of kStagingBytes at most, each slot reused once the copy that last
  // read it has run (its event), so the host queues ahead; large downloads pass through them too (to_host: each
  // event then also marks its piece's arrival). Allocated at their full size in the constructor (16 MiB
  // of pinned host memory in all): a cudaMallocHost or cudaFreeHost in the step loop may synchronise the device.
  struct Staging {
    void* host = nullptr;
    cudaEvent_t read = nullptr;  // recorded after the copy that last read `host`
  };
  static constexpr size_t kStagingBytes = size_t{4} << 20;
  Staging staging_[4];
  int next_staging_ = 0;
  bool profile_ = false;
  // The profile (GPT_TRAIN_CUDA_PROFILE=1): the event pool, reused after each read (grown during the first step);
  // the timed ops whose events are not read yet (events start, start + 1); the sums by op. Mutable: the report
  // (const) reads what is pending first.
  static constexpr size_t kMaxOpEvents = size_t{1} << 14;
  std::vector<cudaEvent_t> op_events_;
  struct PendingOp {
    const char* op;
    OpShape shape;
    OpWork work;
    size_t start;
  };
  mutable std::vector<PendingOp> pending_ops_;
  mutable size_t next_op_event_ = 0;
  struct OpTime {
    const char* op;
    OpShape shape{};
    double ms = 0.0;
    int64_t calls = 0;
    OpWork work{0.0, 0.0};  // summed over the calls
  };
  mutable std::vector<OpTime> op_times_;
  // The index of a fresh event recorded on the stream now.
  size_t record_op_event();
  // Adds the pending ops' times to op_times_ and frees the pool. REQUIRES: the stream is idle.
  void read_op_times() const;
};

// The CUDA backend on the GPU of local rank `local_rank` of `local_size` (device_for_local_rank), or an error
// when no GPU is visible or there are fewer GPUs than ranks on the node.
Expected<std::unique_ptr<Backend>> make_cuda_backend(int local_rank, int local_size);

}  // namespace gpt
