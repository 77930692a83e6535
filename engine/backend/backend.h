// Backend: the op interface the model is written against. `kernels/cpu` implements it with oneDNN's
// sgemm and vectorised OpenMP loops; `kernels/cuda` with CUDA kernels and cuBLASLt.
// Pointers are device pointers of this backend (host memory for the CPU backend); host code touches them
// only through to_device/to_host unless host_memory(). Ops are queued in order on the backend's one stream
// (the CPU runs them at once); results that come back as values (sum_squares) wait for the queue. Shapes
// are written on the arguments: N = rows (B*T), C = channels, OC = output channels, NH = heads, V = vocab.
//
// Accumulation rules, the same on every backend:
//  - parameter gradients (dweight, dbias, dwte, dwpe) are accumulated into (+=), so micro-batches add up;
//  - layernorm_backward accumulates into dinp (the residual stream's gradient);
//  - every other output is overwritten.
// Every op is deterministic for a given thread count: no float atomics, fixed reduction orders.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "core/status.h"

namespace gpt {

class Communicator;

// A device's memory as its driver reports it, in bytes, and what of the used part the backend holds for itself.
struct DeviceMemory {
  int64_t total = 0;
  int64_t free = 0;
  // Of total - free: the buffers the backend allocated when it was made (cuBLASLt's workspace), which every
  // plan counts in its workspace; so a plan may take free + this.
  int64_t backend_bytes = 0;
};

// Identifies one dropout mask: element i of the mask is dropped iff rng.uniform(base + i) < p. `base` is
// the first element's global index (from the global row), so masks do not depend on how rows are split.
struct DropoutMask {
  float p = 0.0f;
  CounterRng rng{0, 0};
  uint64_t base = 0;
  GPT_HOST_DEVICE bool active() const { return p > 0.0f; }
};

// A run of the optimizer's local buffers: elements [begin, begin + length), weight-decayed or not. `index` is
// the first element's index in the whole (unsharded) model's flat parameters, so what depends on it
// (stochastic rounding) is the same under every strategy and world size. The bf16 copy of element i (the
// param_lo / dst of the span ops) is at i + lo_shift: 0 when it is laid out like the fp32 buffers; bf16 ZeRO-1/2
// write it straight into this rank's block of the gathered parameters.
struct OptimSpan {
  int64_t begin = 0;
  int64_t length = 0;
  uint64_t index = 0;
  bool decay = false;
  int64_t lo_shift = 0;
  bool operator==(const OptimSpan&) const = default;  // every field (CudaBackend finds its span tables by content)
};

// One AdamW step's hyperparameters. step is 1-based; grads are scaled by grad_scale first (global-norm
// clipping); weight_decay applies to the spans marked decay.
struct AdamWStep {
  float lr = 0.0f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f, grad_scale = 1.0f;
  int64_t step = 1;
};

// How fp32 master weights become bf16 parameters: to nearest even, or stochastically (bf16_bits_stochastic
// with the bits rng.u32(model index) of each element).
struct Bf16Rounding {
  bool stochastic = false;
  CounterRng rng{0, 0};
};

// A pointer into backend memory with its element type, for the activations whose type follows the compute
// dtype: the LayerNorm, GELU and attention outputs, which GEMMs read, are stored in bf16 under bf16 compute (half the
// memory and traffic, and no cast before their GEMMs), fp32 otherwise. Converts implicitly from float* and bf16*,
// so fp32 callers read as before. at(i): the pointer i elements on.
template <typename V>
struct BasicTensorPtr {
  V* data = nullptr;
  DType dtype = DType::kF32;
  BasicTensorPtr() = default;
  BasicTensorPtr(std::nullptr_t) {}
  BasicTensorPtr(V* p, DType t) : data(p), dtype(t) {}
  BasicTensorPtr(std::conditional_t<std::is_const_v<V>, const float, float>* p) : data(p), dtype(DType::kF32) {}
  BasicTensorPtr(std::conditional_t<std::is_const_v<V>, const bf16, bf16>* p) : data(p), dtype(DType::kBF16) {}
  template <typename W, typename = std::enable_if_t<std::is_const_v<V> && !std::is_const_v<W>>>
  BasicTensorPtr(const BasicTensorPtr<W>& o) : data(o.data), dtype(o.dtype) {}
  BasicTensorPtr at(int64_t i) const {
    using Byte = std::conditional_t<std::is_const_v<V>, const char, char>;
    return {data == nullptr ? nullptr : static_cast<Byte*>(data) + i * static_cast<int64_t>(dtype_size(dtype)), dtype};
  }
  bool is_bf16() const { return dtype == DType::kBF16; }
  // The fp32 pointer. REQUIRES: dtype f32.
  auto as_f32() const {
    GPT_CHECK(dtype == DType::kF32);
    return static_cast<std::conditional_t<std::is_const_v<V>, const float, float>*>(data);
  }
  auto as_bf16() const {
    GPT_CHECK(dtype == DType::kBF16);
    return static_cast<std::conditional_t<std::is_const_v<V>, const bf16, bf16>*>(data);
  }
};
using TensorPtr = BasicTensorPtr<void>;
using ConstTensorPtr = BasicTensorPtr<const void>;

// run.gelu_fusion: the MLP's GELU as its own kernels (kNone), fused into the fc GEMM's epilogue (kForward),
// and also its backward into the projection GEMM's input-gradient epilogue (kFull).
enum class GeluFusion { kNone, kForward, kFull };
Expected<GeluFusion> parse_gelu_fusion(std::string_view name);

// run.attention_kernel: which tensor-core attention kernels the CUDA backend takes under bf16 compute: the
// mma.sync flash-attention kernels where the shape allows (kAuto), or the WMMA ones (kWmma).
enum class AttentionKernel { kAuto, kWmma };
Expected<AttentionKernel> parse_attention_kernel(std::string_view name);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Device memory, zero-filled, tracked under `category`.
  virtual Buffer alloc(size_t bytes, MemCategory category) = 0;
  virtual void set_threads(int threads) = 0;
  // True when this backend's pointers are host memory that host code may read and write directly.
  virtual bool host_memory() const { return true; }
  // Copies between host memory and this backend's memory, in order with the queued ops. to_device returns
  // when `src` may be reused (the copy itself may still be queued); to_host returns when `dst` holds the data.
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;
  // Waits until every queued op is complete.
  virtual void synchronize() {}
  // Sizes the backend's own workspaces for steps of a GPT with B sequences of T tokens, C channels, NH heads,
  // V vocabulary entries, an LM head run over chunks of head_rows rows and (`dropout`) training dropout, so
  // that the step loop allocates nothing (the CUDA backend: its scratch area and bf16 cast areas, under the
  // compute dtype set before; under bf16 compute, for a ParamSource that hands GEMMs bf16 weights, as
  // ShardedParams does: fp32 weights are cast into an area grown on first use). Called by Gpt::prepare;
  // nothing to do on the CPU.
  virtual void reserve(int /*B*/, int /*T*/, int /*C*/, int /*NH*/, int /*V*/, int64_t /*head_rows*/,
                       bool /*dropout*/) {}
  // The GPU this backend computes on and its stream (a cudaStream_t), for the device communicator to order
  // collectives after the kernels that produce their buffers; -1 and null on the CPU.
  virtual int device_index() const { return -1; }
  // The device's dense bf16 peak in FLOP/s, the denominator of MFU; 0 when not known (the CPU).
  virtual double peak_flops() const { return 0.0; }
  // The device's memory as the driver counts it (cudaMemGetInfo), in bytes: its size, and what is free now (less
  // this process's buffers, what the CUDA context, cuBLAS(Lt) and NCCL allocate for themselves, and any other
  // process's on the same device); none on the CPU.
  virtual std::optional<DeviceMemory> device_memory() const { return std::nullopt; }
  // total - free of device_memory(): the memory in use on the device; none on the CPU.
  std::optional<int64_t> device_memory_in_use() const {
    const std::optional<DeviceMemory> m = device_memory();
    if (!m) return std::nullopt;
    return m->total - m->free;
  }
  virtual void* native_stream() const { return nullptr; }

  // Parameters (the embedding tables, LayerNorm weights and biases, GEMM biases) are read as fp32: f32, or bf16
  // (ParamSource's bf16-only parameters under bf16 compute), widened, so that an op gives the same result bit for bit
  // as on the fp32 values of the bf16 ones.
  // out(B,T,C) = wte[tokens(B,T)] + wpe[t]; wte and wpe of one dtype.
  virtual void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B,
                                 int T, int C) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                  int C) = 0;

  // The element type the products' inputs are rounded to (the GEMMs' and attention's): f32 (default), or bf16
  // (mixed precision: the tensor cores multiply bf16 and accumulate fp32). Under bf16 the model stores the
  // GEMM-only activations (TensorPtr) in bf16; every other tensor in memory stays fp32. The CPU backend takes
  // bf16 too (GEMM inputs rounded to bf16, products in fp32; attention stays fp32), for testing the model's
  // mixed-precision path on the CPU; the trainer uses it on GPUs only.
  virtual void set_compute_dtype(DType type) = 0;
  virtual DType compute_dtype() const = 0;

  // Whether matmul_gelu_forward and matmul_backward_gelu run as one GEMM each (run.gelu_fusion). An error where
  // the backend cannot fuse: the CPU backend, or the CUDA backend outside bf16 compute (set the compute dtype
  // first). kNone always succeeds.
  virtual Status set_gelu_fusion(GeluFusion fusion) {
    if (fusion == GeluFusion::kNone) return Status::ok();
    return Status::failed_precondition(std::string("backend '") + std::string(name()) +
                                       "' cannot fuse the GELU into its GEMMs (run.gelu_fusion needs run.device cuda "
                                       "and parallel.param_dtype bf16)");
  }
  // The tensor-core attention kernels (run.attention_kernel). An error for kWmma where there are none: the CPU
  // backend, or the CUDA backend outside bf16 compute (set the compute dtype first). kAuto always succeeds.
  virtual Status set_attention_kernel(AttentionKernel kernel) {
    if (kernel == AttentionKernel::kAuto) return Status::ok();
    return Status::failed_precondition(std::string("backend '") + std::string(name()) +
                                       "' has no WMMA attention kernels (run.attention_kernel wmma needs run.device "
                                       "cuda and parallel.param_dtype bf16)");
  }
  // Whether matmul_backward_gelu of width C (bf16 dpre and pre, 16-byte aligned, as the model carves them) runs
  // fused, leaving dinp unwritten: then the caller may pass no dinp, and Gpt::prepare carves none (the planner's
  // activation_bytes asks the same of gelu_fusion full). False by default, and for kNone and kForward.
  virtual bool gelu_backward_fused(int C) const {
    (void)C;
    return false;
  }

  // out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC); bias may be null. inp and weight f32, or either bf16 under
  // bf16 compute (taken as it is; an fp32 operand is rounded to bf16 first).
  // out f32, or bf16 under bf16 compute: the fp32 product plus the bias rounded to bf16 (the bias epilogue of a
  // bf16 GEMM output adds a bf16 bias; a bf16 bias is that already), rounded once to nearest even at the store.
  // out's rows are ld_out >= OC elements apart (the LM head's logits are padded so that every row starts 64-byte
  // aligned, as cuBLASLt's tensor-core kernels want); what the columns past OC hold afterwards is undefined.
  virtual void matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N,
                              int C, int OC, int64_t ld_out) = 0;
  void matmul_forward(TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                      int OC) {
    matmul_forward(out, inp, weight, bias, N, C, OC, OC);
  }
  // dinp(N,C) = dout @ weight (overwritten; skipped if null); dweight(OC,C) += dout^T @ inp; dbias += colsum
  // of dout as the GEMMs take it (under bf16 compute its bf16 values, summed in fp32). dout, inp and weight as inp
  // in matmul_forward; dout's rows ld_dout >= OC elements apart, N * ld_dout of them (a backend may convert the
  // padding with the rest, but no result depends on the columns past OC). dinp f32, or bf16 under bf16 compute
  // (the fp32 product rounded once to nearest even, as PyTorch's autocast leaves a Linear's input gradient).
  virtual void matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                               ConstTensorPtr weight, int64_t N, int C, int OC, int64_t ld_dout) = 0;
  void matmul_backward(TensorPtr dinp, float* dweight, float* dbias, ConstTensorPtr dout, ConstTensorPtr inp,
                       ConstTensorPtr weight, int64_t N, int C, int OC) {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, OC);
  }
  // matmul_backward's dbias alone: dbias(OC) += the column sums of dout(N,OC) as matmul_backward takes it, bit for
  // bit.
  virtual void bias_backward(float* dbias, ConstTensorPtr dout, int64_t N, int OC) = 0;

  // out(N,C) = (inp - mean) * rstd * weight + bias; mean(N), rstd(N) saved for backward (either may be null).
  // out f32, or bf16 (the fp32 result rounded to nearest even, bit for bit cast_to_bf16 of the f32 output).
  virtual void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                                 ConstTensorPtr bias, int64_t N, int C) = 0;
  // dinp (the residual stream's gradient) is accumulated into; dinp_lo, when not null, also gets the accumulated
  // dinp rounded to bf16 (as cast_to_bf16 rounds), the projection GEMMs' output gradient under bf16 compute. dout
  // f32, or bf16 (the next GEMM's input gradient under bf16 compute), read as fp32.
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                                  ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C,
                                  bf16* dinp_lo) = 0;
  // The residual add fused with the LayerNorm that reads its result (llm.c's fused residual + LayerNorm):
  // res_out(N,C) = res + dropout(inp), then layernorm_forward(out, mean, rstd, res_out, ...). res_out may alias
  // res. Bit for bit the two separate ops (recomputation uses plain layernorm_forward on the stored res_out);
  // a backend fuses them to read the residual stream once. The default runs the two ops. inp as residual_forward's.
  virtual void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                          ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N,
                                          int C, const DropoutMask& drop) {
    residual_forward(res_out, res, inp, N * C, drop);
    layernorm_forward(out, mean, rstd, res_out, weight, bias, N, C);
  }

  // Causal multi-head attention. qkv(B,T,3C) holds q|k|v; out(B,T,C). `att` is the state forward saves
  // for backward, attention_state_floats(B,T,NH) floats: the CPU keeps the softmax probabilities
  // (B,NH,T,T); the CUDA backend's fused kernel keeps only each row's log-sum-exp (B,NH,T). Attention
  // dropout (mask element ((b*NH + h)*T + t)*T + t2, offset by drop.base) applies to the probabilities in
  // the product. Backward also reads forward's `out`. qkv, out and dqkv share one dtype: f32, or bf16 (the model's
  // under bf16 compute: read as fp32, written rounded as layernorm_forward's); the tensor-core backward's
  // D = rowsum(dout * out) takes out as bf16 either way. dout f32, or bf16 (the projection GEMM's input gradient
  // under bf16 compute), read as fp32 (the tensor-core kernels multiply its bf16 rounding either way).
  virtual int64_t attention_state_floats(int B, int T, int NH) const = 0;
  virtual void attention_forward(TensorPtr out, float* att, ConstTensorPtr qkv, int B, int T, int C, int NH,
                                 const DropoutMask& drop) = 0;
  // dqkv_bias, when not null: also bias_backward(dqkv_bias, dqkv, B T, 3C), the gradient of the bias of the projection
  // that made qkv, as matmul_backward would sum it from dqkv (the CUDA backend's wgmma kernels sum the values they
  // store as they store them, in another order: within rounding of it).
  virtual void attention_backward(TensorPtr dqkv, ConstTensorPtr dout, ConstTensorPtr qkv, ConstTensorPtr out,
                                  const float* att, int B, int T, int C, int NH, const DropoutMask& drop,
                                  float* dqkv_bias) = 0;
  // Inference over a KV cache (sampling): the causal attention of positions [t0, T) of one sequence over its
  // positions [0, T). qkv(T,3C) holds every position's q|k|v (those before t0 written by earlier calls); out(T-t0,C)
  // gets rows t0.. of what attention_forward gives for this qkv without dropout (within rounding: the sums may run
  // in another order). No state is kept. Dtypes as attention_forward's. REQUIRES 0 <= t0 < T.
  virtual void attention_forward_rows(TensorPtr out, ConstTensorPtr qkv, int T, int t0, int C, int NH) = 0;

  // The MLP's fc GEMM and its GELU: pre(N,OC) = matmul_forward(inp, weight, bias), the GELU's input (kept for
  // backward), and out = GELU(pre); pre and out as matmul_forward's and gelu_forward's outputs. Unfused (the
  // default, and GeluFusion::kNone): those two ops, bit for bit. Fused (the CUDA backend under kForward/kFull:
  // cuBLASLt's GELU_AUX_BIAS epilogue): pre as matmul_forward's; out is GELU of the fp32 sum before its rounding
  // to pre's bf16, computed by cuBLASLt, so within a bf16 place of the unfused out (which is also what `selective`
  // checkpointing recomputes in backward: gelu_forward of pre).
  virtual void matmul_gelu_forward(TensorPtr pre, TensorPtr out, ConstTensorPtr inp, ConstTensorPtr weight,
                                   ConstTensorPtr bias, int64_t N, int C, int OC) {
    matmul_forward(pre, inp, weight, bias, N, C, OC);
    gelu_forward(out, pre, N * OC);
  }
  // The GEMM after the GELU, backward through both: dpre(N,C) = gelu_backward of dinp = dout @ weight at `pre`
  // (the GELU's input), dweight and dbias as matmul_backward's (inp is the GELU's output), and, when dpre_bias is
  // not null, bias_backward(dpre_bias, dpre): the gradient of the bias of the GEMM before the GELU (the fc's), which
  // a backend may sum while it writes dpre instead of reading dpre again (the CUDA backend does). Unfused (the
  // default, and kNone/kForward): matmul_backward into dinp ((N,C) scratch, as matmul_backward's), then
  // gelu_backward(dpre, pre, dinp) and that bias_backward, bit for bit; dpre may alias dinp of its dtype. Fused
  // (gelu_backward_fused(C): the CUDA backend under kFull, cuBLASLt's DGELU epilogue on the dinp GEMM): dpre bf16,
  // written by the GEMM from its fp32 sum (dinp is not written, and may be null), so within a bf16 place of the
  // unfused dpre; dpre_bias still bias_backward's of the dpre written.
  virtual void matmul_backward_gelu(TensorPtr dpre, float* dpre_bias, TensorPtr dinp, float* dweight, float* dbias,
                                    ConstTensorPtr dout, ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr pre,
                                    int64_t N, int C, int OC) {
    GPT_CHECK_MSG(dinp.data != nullptr,
                  "matmul_backward_gelu unfused needs dinp: was the model prepared under a fused "
                  "GELU backward (run.gelu_fusion full) that is now off?");
    matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    gelu_backward(dpre, pre, dinp, N * C);
    if (dpre_bias != nullptr) bias_backward(dpre_bias, dpre, N, C);
  }

  // GELU, tanh approximation. out f32, or bf16 (rounded as layernorm_forward's).
  // inp f32, or bf16 (the MLP's fc output under bf16 compute), read as fp32. dout f32, or bf16 (the projection
  // GEMM's input gradient under bf16 compute), read as fp32. dinp f32, or bf16 (rounded as layernorm_forward's; the
  // fc GEMM's output gradient under bf16 compute); it may alias dout of its own dtype.
  virtual void gelu_forward(TensorPtr out, ConstTensorPtr inp, int64_t N) = 0;
  virtual void gelu_backward(TensorPtr dinp, ConstTensorPtr inp, ConstTensorPtr dout, int64_t N) = 0;

  // out = res + dropout(inp) (out may alias res). inp f32, or bf16 (a projection GEMM's output under bf16 compute,
  // as PyTorch's autocast adds a Linear's bf16 output to the fp32 residual stream), read widened.
  virtual void residual_forward(float* out, const float* res, ConstTensorPtr inp, int64_t N,
                                const DropoutMask& drop) = 0;
  // dinp = dropout_backward(dout) (the mask and 1/(1-p) scale); plain copy when inactive.
  virtual void dropout_backward(float* dinp, const float* dout, int64_t N, const DropoutMask& drop) = 0;
  // In-place dropout on x (used after the embedding).
  virtual void dropout_forward(float* x, int64_t N, const DropoutMask& drop) = 0;

  // Fused softmax cross-entropy over rows of logits(N, Vp) whose first V columns are real: f32, or bf16 (the LM
  // head's GEMM output under bf16 compute, as PyTorch's autocast leaves it; read widened). losses(N) gets each
  // row's loss; if dlogits is non-null it gets (softmax - onehot) * dloss: f32, or bf16 (rounded as
  // layernorm_forward's), the LM head's GEMM input under bf16 compute; it may alias logits of its own dtype.
  virtual void crossentropy_forward_backward(float* losses, TensorPtr dlogits, ConstTensorPtr logits,
                                             const int32_t* targets, int64_t N, int V, int Vp, float dloss) = 0;

  // AdamW on n elements: m, v updated; param -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * param).
  // grad is scaled by grad_scale first (global-norm clipping). step is 1-based.
  virtual void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, float grad_scale, int64_t step) = 0;
  // AdamW over every span of the buffers in one pass where the backend can (the CUDA backend: one launch for
  // the whole shard, the multi-tensor kernel). The master weights equal adamw_update's on each span bit for
  // bit; param_lo, when not null, gets the updated weights rounded to bf16 by `rounding` in the same pass (element
  // i at param_lo[i + lo_shift]).
  virtual void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                                  const std::vector<OptimSpan>& spans, const AdamWStep& step,
                                  const Bf16Rounding& rounding) = 0;
  // Sum of squares in double (for the global gradient norm).
  virtual double sum_squares(const float* x, int64_t n) = 0;
  // The sum of squares over every span (in double, a fixed order for given spans), with one wait.
  virtual double sum_squares_spans(const float* x, const std::vector<OptimSpan>& spans) = 0;
  // dst = src rounded to bf16 by `rounding`, over the spans (element i at dst[i + lo_shift]).
  virtual void round_to_bf16_spans(bf16* dst, const float* src, const std::vector<OptimSpan>& spans,
                                   const Bf16Rounding& rounding) = 0;
  virtual void fill_zero(float* x, int64_t n) = 0;
  // Mixed precision: fp32 -> bf16 (round to nearest even) and back.
  virtual void cast_to_bf16(bf16* dst, const float* src, int64_t n) = 0;
  virtual void cast_from_bf16(float* dst, const bf16* src, int64_t n) = 0;
  virtual void copy(float* dst, const float* src, int64_t n) = 0;

  // A table of device time per op since start (or since profile_restart), when the backend was asked to profile
  // (the CUDA backend under GPT_TRAIN_CUDA_PROFILE=1); empty otherwise.
  virtual std::string profile_report() const { return {}; }
  // Forgets the op times so far (the trainer's first step: cuBLASLt's heuristics, the kernels' first loads).
  virtual void profile_restart() {}
};

// The one place backends are registered: "cpu" always; "cuda" when built with CUDA, on the GPU of local rank
// `local_rank` of the `local_size` ranks on this node (device_for_local_rank). Returns an error naming the
// device when it is unknown, not built in, or (cuda) when no GPU is visible or the node has too few.
Expected<std::unique_ptr<Backend>> make_backend(std::string_view device, int local_rank = 0, int local_size = 1);

// The communicator for buffers in `backend`'s memory over the ranks of `bootstrap` (which must outlive it):
// NCCL on the backend's GPU and stream for the cuda backend; an error for a backend without one (the CPU's
// buffers go through `bootstrap` itself). Collective over `bootstrap`.
Expected<std::unique_ptr<Communicator>> make_device_communicator(Communicator& bootstrap, const Backend& backend,
                                                                 std::string name);

}  // namespace gpt
