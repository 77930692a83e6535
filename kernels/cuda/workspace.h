// The CUDA backend's device workspace as arithmetic: the sizes its kernels ask of the shared scratch area and of
// the bf16 cast areas, and the cuBLASLt workspace. Plain C++ (no CUDA headers), so the memory planner counts the
// same bytes the kernels use, in builds without CUDA too; kernels/cuda takes its constants from here.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace gpt::cuda_workspace {

constexpr size_t kAlign = 256;  // every scratch piece starts on a 256-byte boundary (and cudaMalloc rounds to it)
inline size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// cuBLASLt's workspace, allocated once (cuBLAS's recommendation for Hopper).
constexpr size_t kCublasLtBytes = size_t{32} << 20;
// GPT_GEMM_WGRAD_STREAM=1, an experiment (kernels/cuda/matmul.cu; read when a CUDA backend is made, and by the
// planner): the weight-gradient GEMMs run on a second stream beside the input gradient's, with a cuBLASLt workspace
// of their own.
inline bool wgrad_stream_enabled() {
  const char* v = std::getenv("GPT_GEMM_WGRAD_STREAM");
  return v != nullptr && std::string_view(v) == "1";
}
// The CUDA backend's cuBLASLt workspaces together.
inline size_t cublaslt_bytes() { return kCublasLtBytes * (wgrad_stream_enabled() ? 2 : 1); }

// Whether cuBLASLt's GELU epilogues take a GELU tensor of `width` columns (OC forward, C backward): its leading
// dimension must be a multiple of 8. The planner asks too: under run.gelu_fusion full the model then carves no fp32
// gradient at the GELU's output (d4).
inline bool gelu_epilogue_fits(int64_t width) { return width % 8 == 0; }

// layernorm.cu: the backward's row chunks (fixed, so the sum order is too); scratch = per-chunk dweight/dbias
// partials (kLayerNormChunks x 2C floats).
constexpr int kLayerNormChunks = 512;
inline size_t layernorm_backward(int64_t /*N*/, int C) {
  return align_up(static_cast<size_t>(kLayerNormChunks) * 2 * C * 4);
}

// matmul.cu's bias_backward (and gelu.cu's GELU backward with the fc bias): dbias partials, one row of OC floats per
// chunk of kDbiasRows rows.
constexpr int kDbiasRows = 256;
inline size_t matmul_backward(int64_t N, int OC) { return static_cast<size_t>(ceil_div(N, kDbiasRows)) * OC * 4; }
// matmul.cu's backward_dgelu: those partials, then (GPT_GEMM_DGELU_BGRAD) the DGELU_BGRAD epilogue's C sums.
inline size_t matmul_backward_dgelu(int64_t N, int C, int OC) {
  return align_up(matmul_backward(N, OC)) + static_cast<size_t>(C) * 4;
}

// attention.cu, attention_tc.cu and attention_mma_backward.cu: the backward's D = rowsum(dO * O), one float per (B, NH,
// T).
inline size_t attention_backward(int B, int T, int NH) { return static_cast<size_t>(B) * NH * T * 4; }
// attention_mma_backward.cu at head size 32 or 64 without dropout (its lean kernels) also keeps dS^T: the dK/dV
// kernel writes it (bf16, keys x queries, Tp x Tp per (b, h), Tp = T rounded up to 64; only dS's blocks at and below
// its diagonal) and the dQ kernel reads it instead of recomputing S, P and dP (three products of its four). Up to
// kAttentionDsMaxBytes (GPT-2 124M at batch 16: 403 MB, at batch 64: 1.61 GB beside its ~24 GiB of activations, at
// batch 128: 3.2 GB beside ~48); past it the dQ kernel recomputes (and on sm_90 the backward leaves wgmma).
constexpr size_t kAttentionDsMaxBytes = size_t{4} << 30;
inline int64_t attention_ds_stride(int64_t T) { return ceil_div(T, 64) * 64; }
inline size_t attention_ds_bytes(int B, int T, int NH) {
  const auto tp = static_cast<size_t>(attention_ds_stride(T));
  return static_cast<size_t>(B) * NH * tp * tp * 2;
}
inline bool attention_ds_kept(int B, int T, int C, int NH, bool dropout) {
  return NH > 0 && C % NH == 0 && (C / NH == 32 || C / NH == 64) && !dropout &&
         attention_ds_bytes(B, T, NH) <= kAttentionDsMaxBytes;
}
// attention_wgmma_backward.cu, where it sums the qkv projection's bias gradient: the column sums of dqkv (B,T,3C) per
// 16 rows of a sequence, one row of 3C floats each (the dQ kernel's and the dK/dV kernel's warps write their own),
// then the sums of up to kAttentionBiasGroups groups of those rows (the first of its two summing passes).
inline int64_t attention_bias_chunks(int64_t B, int64_t T) { return B * ceil_div(T, 16); }
constexpr int64_t kAttentionBiasGroups = 32;
inline size_t attention_bias_partials(int64_t B, int64_t T, int64_t C) {
  return static_cast<size_t>((attention_bias_chunks(B, T) + kAttentionBiasGroups) * 3 * C) * 4;
}
// The mma.sync backward's whole scratch: D, then (where kept) dS^T at the next 256-byte boundary, then the bias
// partials (used on sm_90 only; dS^T's size is a multiple of 8 KB, so they start aligned).
inline size_t attention_backward_mma(int B, int T, int C, int NH, bool dropout) {
  return attention_ds_kept(B, T, C, NH, dropout)
             ? align_up(attention_backward(B, T, NH)) + attention_ds_bytes(B, T, NH) + attention_bias_partials(B, T, C)
             : attention_backward(B, T, NH);
}

// embedding.cu: three int32 arrays of B*T (keys, sorted keys, sorted positions) before cub's sort storage,
// whose size cub reports at run time (embedding_backward_scratch_bytes adds it).
inline size_t embedding_backward_fixed(int64_t n) { return 3 * align_up(static_cast<size_t>(n) * 4); }
// An upper estimate of cub::DeviceRadixSort::SortPairs' temporary storage for n int32 key/value pairs, for
// planning without a GPU: its alternate key and value buffers (8 bytes a pair), the onesweep look-back state
// (4 passes x 256 bins x 4 bytes per tile of a few thousand items: under 1 byte a pair) and the histograms.
inline size_t embedding_sort_estimate(int64_t n) { return align_up(static_cast<size_t>(n) * 9 + (size_t{1} << 20)); }

// adamw.cu: sum_squares' per-block partials; the multi-tensor kernels' span tables and per-tile partials.
constexpr int kSumBlocks = 256;
inline size_t sum_squares() { return kSumBlocks * sizeof(double); }
constexpr int64_t kOptimTile = 4096;
constexpr size_t kOptimSpanBytes = 40;  // sizeof(OptimSpan)
// A span table (the spans and their tile prefix), in device memory of its own, one per distinct list.
inline size_t span_table(int64_t spans) {
  return align_up(static_cast<size_t>(spans) * kOptimSpanBytes) + align_up(static_cast<size_t>(spans + 1) * 8);
}
// sum_squares_spans' scratch: one double per tile.
inline size_t sum_squares_spans(int64_t tiles) { return static_cast<size_t>(tiles) * 8; }

// The dimensions of a GPT as its step's ops see them: rows N = B*T, channels C, heads NH, vocabulary V, and
// the rows of the LM head's chunks (Gpt::head_rows).
struct ModelDims {
  int64_t B = 0, T = 0, C = 0, NH = 0, V = 0, head_rows = 0;
  bool dropout = false;  // training with dropout (p > 0): the residual stream's gradient reaches GEMMs in fp32
  int64_t N() const { return B * T; }
};

// What one forward/backward of the model asks of the backend's areas: the scratch area's largest request
// (given embedding_backward's, which includes cub's sort storage) and each bf16 cast area's largest operand
// (elements; 0 under fp32 compute). The gradient norm's per-tile partials (sum_squares_spans) may ask more.
struct StepAreas {
  size_t scratch = 0;
  int64_t cast[4] = {0, 0, 0, 0};  // GEMM input, weight, output gradient, bias
};
inline StepAreas step_areas(const ModelDims& d, bool bf16_compute, size_t embedding_scratch) {
  const int64_t N = d.N(), C = d.C;
  StepAreas a;
  a.scratch = std::max({embedding_scratch, layernorm_backward(N, static_cast<int>(C)),
                        matmul_backward(N, static_cast<int>(4 * C)),  // the widest bias gradient: the fc's
                        attention_backward(static_cast<int>(d.B), static_cast<int>(d.T), static_cast<int>(d.NH)),
                        sum_squares()});
  // The mma.sync attention backward's dS^T: bf16 compute only (the kernels that keep it are bf16 ones; reserved for
  // them whichever attention kernels run).
  if (bf16_compute) {
    // The fcproj's backward with the DGELU epilogue (bf16 only), at N below 256 past the fc's bias partials.
    a.scratch = std::max(a.scratch, matmul_backward_dgelu(N, static_cast<int>(4 * C), static_cast<int>(C)));
    a.scratch = std::max(a.scratch, attention_backward_mma(static_cast<int>(d.B), static_cast<int>(d.T),
                                                           static_cast<int>(d.C), static_cast<int>(d.NH), d.dropout));
  }
  if (bf16_compute) {
    // Gpt stores every GEMM input activation in bf16, and under bf16 compute every ShardedParams strategy holds the
    // parameters in bf16 (param_dtype bf16): the input and weight areas are for fp32 callers only (grown on use).
    a.cast[0] = 0;
    a.cast[1] = 0;
    // The residual stream's gradient into the projections, with dropout only: without it the LayerNorm backward
    // leaves a bf16 copy (dqkv, the GELU's and the LM head's output gradients come in bf16 anyway).
    a.cast[2] = d.dropout ? N * C : 0;
    // Biases as the outputs' dtypes want them: an fp32 or unaligned one for a bf16 output (every biased GEMM's under
    // bf16 compute), at most the fc GEMM's (4C, the GELU's input); or a bf16 bias widened for an fp32 output (C
    // floats, the room of 2C bf16), which the model no longer asks for.
    a.cast[3] = 4 * C;
  }
  return a;
}

}  // namespace gpt::cuda_workspace
