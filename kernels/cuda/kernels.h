// The CUDA kernels' launchers, one family per file, each the twin of the CPU kernel of the same name in
// kernels/cpu (same arguments, same accumulation rules; see engine/backend/backend.h). All pointers are
// device memory; every launcher queues its work on `stream` and returns without waiting. A launcher that
// needs temporary memory takes `scratch` of at least <op>_scratch_bytes(...) bytes (the backend owns one
// scratch area, sized once); scratch may be reused by the next launch on the same stream.
// Determinism: no float atomics; every reduction has a fixed order for a given shape.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {

// embedding.cu. Backward sorts the token positions by token id (stable) and sums each token's rows in
// position order: deterministic without atomics.
// wte and wpe: fp32, or both bf16 (read widened).
void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B, int T, int C,
                       cudaStream_t stream);
size_t embedding_backward_scratch_bytes(int B, int T);
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        void* scratch, cudaStream_t stream);

// layernorm.cu. mean/rstd may be null (recomputation that only needs out); out f32 or bf16 (rounded at the store).
// weight and bias: fp32, or both bf16 (read widened).
void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                       ConstTensorPtr bias, int64_t N, int C, cudaStream_t stream);
// The fused residual + LayerNorm: res_out = res + dropout(inp) (the residual_forward expression; res_out may
// alias res; inp f32 or bf16, read widened), then layernorm_forward of res_out, bit for bit the two kernels.
void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                                const DropoutMask& drop, cudaStream_t stream);
size_t layernorm_backward_scratch_bytes(int64_t N, int C);
// dout f32 or bf16 (read widened). dinp_lo, when not null, gets the accumulated dinp rounded to bf16 in the same pass.
void layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                        ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C, bf16* dinp_lo,
                        void* scratch, cudaStream_t stream);

// attention.cu: fused causal attention (flash-style: online softmax, no T x T matrix in memory).
// lse(B,NH,T) is each query row's log-sum-exp of the scaled scores. Head size C/NH <= 128. qkv, out and dqkv share
// one dtype: f32, or bf16 (the model's under bf16 compute: read as fp32, written rounded to nearest even).
void attention_forward(TensorPtr out, float* lse, ConstTensorPtr qkv, int B, int T, int C, int NH,
                       const DropoutMask& drop, cudaStream_t stream);
// Rows [t0, T) of one sequence's attention over a KV cache (Backend::attention_forward_rows); out has qkv's dtype.
void attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH, cudaStream_t stream);
size_t attention_backward_scratch_bytes(int B, int T, int C, int NH);
// D(B,NH,T) = rowsum(dout * out) per head, the first step of both attention backwards (attention_tc.cu's too).
// `round_out`: an fp32 out is rounded to bf16 first (a bf16 one is read as it is): the tensor-core backward's D
// does not depend on the dtype out was stored in. dout f32 or bf16 (read widened), here and in attention_backward.
void attention_row_dot(float* dv, ConstTensorPtr dout, ConstTensorPtr out, bool round_out, int B, int T, int C, int NH,
                       cudaStream_t stream);
void attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out, const float* lse,
                        int B, int T, int C, int NH, const DropoutMask& drop, void* scratch, cudaStream_t stream);

// crossentropy.cu: one pass per row over the vocabulary in chunks (online max and sum), then dlogits. logits f32
// or bf16 (read widened); dlogits f32 or bf16 (rounded at the store), may be logits itself when of its dtype.
void crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits, const int32_t* targets,
                                   int64_t N, int V, int Vp, float dloss, cudaStream_t stream);

// gelu.cu. inp and dout f32 or bf16; out and dinp f32 or bf16 (rounded at the store); dinp may alias dout of its dtype.
void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N, cudaStream_t stream);
void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N, cudaStream_t stream);
// gelu_backward over N rows of C, and dbias(C) += the column sums of dinp as stored (bf16 values widened): the fc
// GEMM's bias gradient taken while dinp is written, where bias_backward would read it again; bit for bit
// bias_backward of the stored dinp. scratch: bias_backward_scratch_bytes(N, C).
void gelu_backward_bias(TensorPtr dinp, float* dbias, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N, int C,
                        void* scratch, cudaStream_t stream);

// elementwise.cu. residual_forward's inp f32 or bf16 (read widened).
void residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N, const DropoutMask& drop,
                      cudaStream_t stream);
void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop, cudaStream_t stream);
void dropout_forward(float* x, int64_t N, const DropoutMask& drop, cudaStream_t stream);
void cast_to_bf16(bf16* dst, const float* src, int64_t n, cudaStream_t stream);
void cast_from_bf16(float* dst, const bf16* src, int64_t n, cudaStream_t stream);

// adamw.cu
void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int64_t step, cudaStream_t stream);
size_t sum_squares_scratch_bytes();
// Writes sum(x^2) as one double to *result (device memory) in a fixed order.
void sum_squares(double* result, const float* x, int64_t n, void* scratch, cudaStream_t stream);
// The multi-tensor forms: one launch over every span (Backend::adamw_update_spans and friends). A span table on
// the device lists the spans with elements (each owns ceil(length / 4096) tiles, a block each) and the prefix of
// their tile counts, which maps a block to its span. It is written once per distinct list of spans into
// span_table_bytes(spans) of device memory and read by every launch that takes it.
struct SpanTable {
  const OptimSpan* spans = nullptr;
  const int64_t* tile_start = nullptr;
  int count = 0;
  int64_t tiles = 0;
};
size_t span_table_bytes(const std::vector<OptimSpan>& spans);
// Copies the table into `device` and waits for the copy (its host arrays are temporaries).
SpanTable write_span_table(const std::vector<OptimSpan>& spans, void* device, cudaStream_t stream);
void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo, const SpanTable& t,
                        const AdamWStep& s, const Bf16Rounding& rounding, cudaStream_t stream);
void round_to_bf16_spans(bf16* dst, const float* src, const SpanTable& t, const Bf16Rounding& rounding,
                         cudaStream_t stream);
size_t sum_squares_spans_scratch_bytes(const SpanTable& t);
void sum_squares_spans(double* result, const float* x, const SpanTable& t, void* scratch, cudaStream_t stream);

// matmul.cu: bias gradients. dbias(OC) += the column sums of dout (N rows ld >= OC elements apart; f32, or bf16 summed
// in fp32), deterministic: partials over fixed chunks of cuda_workspace::kDbiasRows rows (common.cuh's
// column_partials), then bias_backward_sum adds them in chunk order. scratch: bias_backward_scratch_bytes(N, OC).
size_t bias_backward_scratch_bytes(int64_t N, int OC);
void bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC, int64_t ld, void* scratch,
                   cudaStream_t stream);
// The second step alone, for a kernel that wrote the partials (column_partials) itself.
void bias_backward_sum(float* dbias, const float* partial, int64_t N, int OC, cudaStream_t stream);

// matmul.cu: GPT_GEMM_ALGO_CACHE's file (if that is set) reads as a cache of GEMM algorithms for the current GPU and
// this cuBLASLt, or does not exist yet; otherwise an error that names the file (make_cuda_backend asks before the
// backend's Matmul reads it).
Status check_gemm_algo_cache();

// matmul.cu: cuBLASLt GEMMs with fp32 accumulation and fp32 outputs (the forward's may be bf16); inputs fp32 (no
// TF32, so results match the CPU to fp32 rounding) or bf16 (tensor cores; the caller casts). dbias is a deterministic
// fp32 column sum of dout as the GEMMs take it. Matmul holds the cuBLASLt handle; its workspace
// (cuda_workspace::kCublasLtBytes of device memory, allocated once by the owner so that it is counted) must outlive it.
// With a side stream (GPT_GEMM_WGRAD_STREAM=1, an experiment; its own workspace of the same size) a backward's weight
// and bias gradients run on the side stream while its input gradient runs on `stream`: forked after the work queued
// on `stream` before the call, joined back into `stream` before the call returns, so every later launch on `stream`
// is ordered after both as without it. The weight gradients' GEMMs leave most SMs idle (their outputs are a few dozen
// tiles; their k is the B*T rows), and the input gradient's blocks fill them. Same kernels, same results.
class Matmul {
 public:
  Matmul(cudaStream_t stream, void* workspace, cudaStream_t side_stream = nullptr, void* side_workspace = nullptr);
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;
  // out(N,OC) = inp(N,C) weight(OC,C)^T + bias; inp and weight of `type` (f32 or bf16). out of out_type: f32, or
  // bf16 (with bf16 inputs; then the bias, if any, is bf16 and 16-byte aligned: cuBLASLt's bias epilogue for a
  // bf16 output takes a bf16 bias); bias f32 otherwise.
  // out's rows are ld >= OC elements apart (no column past OC is written).
  void forward(void* out, DType out_type, const void* inp, const void* weight, DType type, const void* bias, int64_t N,
               int C, int OC, int64_t ld);
  // dout, inp and weight are the GEMM inputs of `type`; dbias sums dout's values (bf16 ones in fp32) as bias_backward
  // does (scratch: bias_backward_scratch_bytes(N, OC), when dbias is asked). dout's rows are ld >= OC elements apart
  // (no column past OC is read). dinp (skipped if null) f32, or bf16 with bf16 inputs (the fp32 sum rounded once).
  void backward(TensorPtr dinp, float* dweight, float* dbias, const void* dout, const void* inp, const void* weight,
                DType type, int64_t N, int C, int OC, int64_t ld, void* scratch);
  // Whether the GELU epilogues take these operands: bf16, rows (OC forward, C backward) a multiple of 8 (cuBLASLt's
  // rule for the GELU input's leading dimension).
  static bool gelu_fusable(int64_t rows) { return cuda_workspace::gelu_epilogue_fits(rows); }
  // forward with cuBLASLt's GELU_AUX(_BIAS) epilogue, all bf16: pre = inp weight^T + bias (the bias bf16 and
  // 16-byte aligned, or null), out = GELU(pre) (tanh form) of the fp32 sum. REQUIRES: gelu_fusable(OC).
  void forward_gelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight, const bf16* bias, int64_t N, int C,
                    int OC);
  // backward with cuBLASLt's DGELU epilogue on the input gradient: dpre = GELU'(pre) * (dout weight), bf16 from
  // the fp32 sum; dweight and dbias as backward's. All bf16. dpre_bias (or null): under GPT_GEMM_DGELU_BGRAD=1 (an
  // experiment) += dpre's column sums (the gradient of the bias before the GELU), of the fp32 values before their
  // rounding, from the same epilogue (DGELU_BGRAD) into scratch past dbias's partials, then one small kernel; returns
  // whether it did (false: the caller sums it from dpre). scratch: backward_dgelu_scratch_bytes(N, C, OC).
  // REQUIRES: gelu_fusable(C).
  bool backward_dgelu(bf16* dpre, const bf16* pre, float* dpre_bias, float* dweight, float* dbias, const bf16* dout,
                      const bf16* inp, const bf16* weight, int64_t N, int C, int OC, void* scratch);
  static size_t backward_dgelu_scratch_bytes(int64_t N, int C, int OC);

 private:
  // The epilogue's activation part; aux: the GELU input (ld = ldc). kDGeluBGrad: kDGelu, and `bias` an output instead,
  // fp32 (m elements, 16-byte aligned): C's row sums (DGELU_BGRAD). The values are part of GPT_GEMM_ALGO_CACHE's keys
  // (3 was the weight gradients' BGRADB experiment, removed).
  enum class Act { kNone = 0, kGeluAux = 1, kDGelu = 2, kDGeluBGrad = 4 };
  // A stream and the cuBLASLt workspace (kWorkspaceBytes of device memory, the owner's) its GEMMs use.
  struct Lane {
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
  };
  // Returns false only for kDGeluBGrad when cuBLASLt has no algorithm for it (then nothing ran); true otherwise.
  bool gemm(const Lane& lane, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
            const void* b, int64_t ldb, DType ab_type, void* c, DType c_type, int64_t ldc, float beta, const void* bias,
            Act act = Act::kNone, const void* aux = nullptr);
  void dweight_dbias(const Lane& lane, float* dweight, float* dbias, const void* dout, const void* inp, DType type,
                     int64_t N, int C, int OC, int64_t ld, void* scratch);
  // The lane a backward's weight and bias gradients take: the side lane (forked from the main stream now) where there
  // is one and the call also computes an input gradient, else the main lane. join_gradients after the call's last
  // launch.
  const Lane& fork_gradients(bool with_dinp, bool with_dweight_or_dbias);
  void join_gradients(const Lane& lane);
  Lane main_, side_;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;  // side lane only
  void* handle_ = nullptr;                           // cublasLtHandle_t
  struct AlgoCache;  // the algorithm per GEMM shape, chosen once per shape (and GPT_GEMM_ALGO_CACHE's file)
  std::unique_ptr<AlgoCache> algos_;
};

}  // namespace gpt::cuda
