// LayerNorm over the last dimension on the GPU, the twin of kernels/cpu/layernorm.cc (fp32 statistics,
// eps = 1e-5). Deterministic without atomics: every row reduction is a warp reduction over a fixed
// element-to-lane map (groups of 4 consecutive channels dealt round-robin to the lanes, whether the group is
// loaded as one float4 or as 4 scalars), and dweight/dbias are summed per column over fixed row chunks
// (a chunk count that depends only on N), the chunks' partials then added in chunk order.
#include <cstdint>

#include "core/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kRowWarps = 8;                    // rows (one warp each) per block in the row kernels
constexpr int kRowThreads = kWarp * kRowWarps;  // their block size
constexpr int kChunks =
    cuda_workspace::kLayerNormChunks;        // most row chunks in the backward; fixed, so the sum order is too
constexpr size_t kBackwardSmem = 96 * 1024;  // the backward's accumulators per block: fits an A100's and an H100's SM
constexpr int kParamRows = 16;               // chunk strides per column in the partial-sum kernel
constexpr int kParamThreads = kWarp * kParamRows;  // its block: 32 columns x kParamRows

// Reads elements [j, j + 4) of p into v. kVec: one float4 (the caller guarantees p is 16-byte aligned and
// n % 4 == 0). Otherwise scalars, elements at or past n read as `fill`. Either way v holds the same values,
// so the order of the sums that use them does not depend on which path ran.
template <bool kVec>
__device__ inline void load4(float (&v)[4], const float* p, int j, int n, float fill) {
  if constexpr (kVec) {
    const float4 t = *reinterpret_cast<const float4*>(p + j);
    v[0] = t.x;
    v[1] = t.y;
    v[2] = t.z;
    v[3] = t.w;
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = j + k < n ? p[j + k] : fill;
  }
}

// The bf16 parameters (weight, bias), widened: kVec reads one 8-byte piece (p + j 8-byte aligned).
template <bool kVec>
__device__ inline void load4(float (&v)[4], const bf16* p, int j, int n, float fill) {
  if constexpr (kVec) {
    load4_bf16(v, p + j);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = j + k < n ? load_value(p + j + k) : fill;
  }
}

// Writes v to elements [j, j + 4) of p, those at or past n skipped (same alignment contract as load4).
template <bool kVec>
__device__ inline void store4(float* p, int j, int n, const float (&v)[4]) {
  if constexpr (kVec) {
    *reinterpret_cast<float4*>(p + j) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (j + k < n) p[j + k] = v[k];
    }
  }
}

// The bf16 output (kVec: p 8-byte aligned and n % 4 == 0).
template <bool kVec>
__device__ inline void store4(bf16* p, int j, int n, const float (&v)[4]) {
  store4_bf16(p + j, v, kVec, n - j);
}

// One warp per row: mean, then the variance around it (two passes, as the CPU), then the output.
// out is not __restrict__ against inp: each lane reads an element before writing the same element, so an
// in-place call would still be correct.
// kResidual: the fused residual + LayerNorm. The first pass computes inp = res + dropout(add) (the expression
// of elementwise.cu's residual_kernel), stores it and sums it; the later passes read back what the same lane
// stored, so the statistics and the output are those of layernorm_forward on the stored residual, bit for bit.
// Out: float, or bf16 (the same fp32 values rounded at the store). W: the parameters' type, float or bf16 (widened).
// A: the residual's added term's type, float or bf16 (widened).
template <bool kVec, bool kResidual, typename Out, typename W, typename A>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_forward_kernel(Out* out, float* __restrict__ mean, float* __restrict__ rstd, float* inp, const float* res,
                             const A* add, DropoutMask drop, float keep, const W* __restrict__ weight,
                             const W* __restrict__ bias, int64_t N, int C) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (row >= N) return;  // the whole warp leaves: only warp shuffles follow, no __syncthreads
  float* x = inp + row * C;
  float v[4];

  float sum = 0.0f;
  for (int j = 4 * lane; j < C; j += 4 * kWarp) {
    if constexpr (kResidual) {
      float a[4], b[4];
      load4<kVec>(a, res + row * C, j, C, 0.0f);
      load4<kVec>(b, add + row * C, j, C, 0.0f);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[k] = a[k] + (drop.active() ? dropped(b[k], drop, keep, row * C + j + k) : b[k]);
      }
      store4<kVec>(x, j, C, v);
    } else {
      load4<kVec>(v, x, j, C, 0.0f);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) sum += v[k];  // elements past C are 0 either way
  }
  const float m = warp_sum(sum) / static_cast<float>(C);

  float sq = 0.0f;
  for (int j = 4 * lane; j < C; j += 4 * kWarp) {
    load4<kVec>(v, x, j, C, m);  // fill m: missing elements add (m - m)^2 = 0
#pragma unroll
    for (int k = 0; k < 4; ++k) sq += (v[k] - m) * (v[k] - m);
  }
  const float var = warp_sum(sq) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + kEps);  // not rsqrtf: IEEE sqrt and division, as the CPU

  Out* y = out + row * C;
  for (int j = 4 * lane; j < C; j += 4 * kWarp) {
    float w[4], b[4], o[4];
    load4<kVec>(v, x, j, C, 0.0f);
    load4<kVec>(w, weight, j, C, 0.0f);
    load4<kVec>(b, bias, j, C, 0.0f);
#pragma unroll
    for (int k = 0; k < 4; ++k) o[k] = (v[k] - m) * s * w[k] + b[k];
    store4<kVec>(y, j, C, o);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = m;
    if (rstd != nullptr) rstd[row] = s;
  }
}

// Backward, one pass over the rows: a block per chunk of rows, `warps` warps (a launch parameter: as many as
// kBackwardSmem holds accumulators for). Warp w takes the chunk's rows w, w + warps, ... in order; for each, the
// row means of dnorm and dnorm * norm (a warp reduction over the same element-to-lane map as the forward), then
// dinp, and the row's dweight/dbias terms added into the warp's accumulator in shared memory (2C floats; a lane
// owns its columns, so no races). Then the block adds its warps' accumulators in warp order into
// partial[chunk] = [dweight (C) | dbias (C)]. Each row's dout and inp come from memory once (the second read of a
// row is a cache hit, in L1 or at wide C in L2), where a row kernel and a column kernel read them twice.
template <bool kVec, typename W, typename G>
__global__ void __launch_bounds__(kRowThreads)
    layernorm_backward_kernel(float* __restrict__ dinp, bf16* __restrict__ dinp_lo, bool lo_vec,
                              float* __restrict__ partial, const G* __restrict__ dout, const float* __restrict__ inp,
                              const W* __restrict__ weight, const float* __restrict__ mean,
                              const float* __restrict__ rstd, int64_t N, int C, int64_t rpc) {
  extern __shared__ float acc[];  // warps x [dweight (C) | dbias (C)]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  float* wacc = acc + static_cast<int64_t>(warp) * 2 * C;
  // Each lane zeroes the columns it alone adds into. kVec: one float4 per group (a warp's accumulator starts
  // 2C floats, a multiple of 16 bytes, after the last), so a warp's lanes hit shared memory without bank conflicts.
  const float zero[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int j = 4 * lane; j < C; j += 4 * kWarp) {
    store4<kVec>(wacc, j, C, zero);
    store4<kVec>(wacc + C, j, C, zero);
  }
  const int64_t r0 = blockIdx.x * rpc;
  const int64_t r1 = r0 + rpc < N ? r0 + rpc : N;
  for (int64_t row = r0 + warp; row < r1; row += warps) {  // warp-uniform
    const float* x = inp + row * C;
    const G* dy = dout + row * C;
    float* dx = dinp + row * C;
    const float m = mean[row], s = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
    for (int j = 4 * lane; j < C; j += 4 * kWarp) {
      float xv[4], dyv[4], w[4];
      load4<kVec>(xv, x, j, C, 0.0f);
      load4<kVec>(dyv, dy, j, C, 0.0f);  // fill 0: missing elements have dnorm = 0 and add nothing
      load4<kVec>(w, weight, j, C, 0.0f);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float norm = (xv[k] - m) * s;
        const float dnorm = w[k] * dyv[k];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * norm;
      }
    }
    const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(C);
    const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
    for (int j = 4 * lane; j < C; j += 4 * kWarp) {
      float xv[4], dyv[4], w[4], d[4];
      load4<kVec>(xv, x, j, C, 0.0f);
      load4<kVec>(dyv, dy, j, C, 0.0f);
      load4<kVec>(w, weight, j, C, 0.0f);
      load4<kVec>(d, dx, j, C, 0.0f);
      float aw[4], ab[4];
      load4<kVec>(aw, wacc, j, C, 0.0f);
      load4<kVec>(ab, wacc + C, j, C, 0.0f);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float norm = (xv[k] - m) * s;
        d[k] += (w[k] * dyv[k] - dnorm_mean - norm * dnorm_norm_mean) * s;
        aw[k] += norm * dyv[k];
        ab[k] += dyv[k];
      }
      store4<kVec>(wacc, j, C, aw);
      store4<kVec>(wacc + C, j, C, ab);
      store4<kVec>(dx, j, C, d);
      if (dinp_lo != nullptr) store4_bf16(dinp_lo + row * C + j, d, lo_vec, C - j);
    }
  }
  __syncthreads();
  float* p = partial + static_cast<int64_t>(blockIdx.x) * 2 * C;
  for (int e = threadIdx.x; e < 2 * C; e += blockDim.x) {
    float t = 0.0f;
    for (int w = 0; w < warps; ++w) t += acc[static_cast<int64_t>(w) * 2 * C + e];
    p[e] = t;
  }
}

// Backward step 3: [dweight | dbias] += the chunks' partials. A block is 32 entries x kParamRows threads; thread
// (x, y) sums chunks y, y + kParamRows, ... in order, then row 0 adds the kParamRows sums in order: a fixed order for
// a shape, with 2C / 32 blocks of kParamRows warps in flight (one thread per entry over every chunk was a handful of
// blocks, each thread a chain of kChunks dependent loads).
__global__ void __launch_bounds__(kParamThreads)
    layernorm_param_grad_kernel(float* __restrict__ dweight, float* __restrict__ dbias,
                                const float* __restrict__ partial, int chunks, int C) {
  __shared__ float sums[kParamRows][kWarp];
  const int e = blockIdx.x * kWarp + threadIdx.x;
  float acc = 0.0f;
  if (e < 2 * C) {
    for (int g = threadIdx.y; g < chunks; g += kParamRows) acc += partial[static_cast<int64_t>(g) * 2 * C + e];
  }
  sums[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || e >= 2 * C) return;
  float total = 0.0f;
  for (int r = 0; r < kParamRows; ++r) total += sums[r][threadIdx.x];
  if (e < C) {
    dweight[e] += total;
  } else {
    dbias[e - C] += total;
  }
}

// The backward's row chunking: depends only on N, so the dweight/dbias sum order is fixed for a shape.
int64_t rows_per_chunk(int64_t N) { return ceil_div(N, kChunks); }

// Warps per block of the backward: as many as kBackwardSmem holds accumulators (2C floats each) for, up to kRowWarps.
int backward_warps(int C) {
  const int64_t warps = static_cast<int64_t>(kBackwardSmem / (2 * static_cast<size_t>(C) * sizeof(float)));
  GPT_CHECK_MSG(warps >= 1, "layernorm_backward: C over 12288 channels is not supported");
  return static_cast<int>(warps < kRowWarps ? warps : kRowWarps);
}

}  // namespace

namespace {

// Both forward entry points: res == nullptr for the plain LayerNorm of x.
template <typename Out, typename W, typename A>
void launch_layernorm_forward(Out* out, float* mean, float* rstd, float* x, const float* res, const A* add,
                              const DropoutMask& drop, const W* weight, const W* bias, int64_t N, int C,
                              cudaStream_t stream) {
  GPT_CHECK(N >= 0 && C > 0);
  GPT_CHECK(out != nullptr && x != nullptr && weight != nullptr && bias != nullptr);
  if (N == 0) return;
  GPT_CHECK(ceil_div(N, kRowWarps) <= INT32_MAX);
  const dim3 grid(static_cast<unsigned>(ceil_div(N, kRowWarps)));
  // A bf16 row of 4k elements is stored as 8-byte pieces, an fp32 one as float4s.
  const bool vec = C % 4 == 0 && aligned4(out) && aligned16(x) && aligned4(weight) && aligned4(bias) &&
                   (res == nullptr || (aligned16(res) && aligned4(add)));
  const float keep = drop.active() ? 1.0f / (1.0f - drop.p) : 1.0f;
  if (res == nullptr) {
    // The plain LayerNorm adds nothing: its kernels only for the (null) fp32 term, not once more per added dtype.
    if constexpr (std::is_same_v<A, float>) {
      if (vec) {
        layernorm_forward_kernel<true, false, Out, W, A>
            <<<grid, kRowThreads, 0, stream>>>(out, mean, rstd, x, nullptr, nullptr, drop, keep, weight, bias, N, C);
      } else {
        layernorm_forward_kernel<false, false, Out, W, A>
            <<<grid, kRowThreads, 0, stream>>>(out, mean, rstd, x, nullptr, nullptr, drop, keep, weight, bias, N, C);
      }
    } else {
      GPT_CHECK_MSG(false, "layernorm_forward: an added term without the residual it adds to");
    }
  } else if (vec) {
    layernorm_forward_kernel<true, true, Out, W, A>
        <<<grid, kRowThreads, 0, stream>>>(out, mean, rstd, x, res, add, drop, keep, weight, bias, N, C);
  } else {
    layernorm_forward_kernel<false, true, Out, W, A>
        <<<grid, kRowThreads, 0, stream>>>(out, mean, rstd, x, res, add, drop, keep, weight, bias, N, C);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

void launch_layernorm_forward(TensorPtr out, float* mean, float* rstd, float* x, const float* res, ConstTensorPtr add,
                              const DropoutMask& drop, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                              cudaStream_t stream) {
  GPT_CHECK_MSG(weight.dtype == bias.dtype, "layernorm_forward: weight and bias of different dtypes");
  with_dtype(out, [&](auto* o) {
    with_dtype(add, [&](auto* a) {
      if (weight.is_bf16()) {
        launch_layernorm_forward(o, mean, rstd, x, res, a, drop, weight.as_bf16(), bias.as_bf16(), N, C, stream);
      } else {
        launch_layernorm_forward(o, mean, rstd, x, res, a, drop, weight.as_f32(), bias.as_f32(), N, C, stream);
      }
    });
  });
}

}  // namespace

void layernorm_forward(TensorPtr out, float* mean, float* rstd, const float* inp, ConstTensorPtr weight,
                       ConstTensorPtr bias, int64_t N, int C, cudaStream_t stream) {
  // The plain kernel only reads inp (the pointer is non-const for the fused variant, which writes it).
  launch_layernorm_forward(out, mean, rstd, const_cast<float*>(inp), nullptr, ConstTensorPtr(), DropoutMask{}, weight,
                           bias, N, C, stream);
}

void residual_layernorm_forward(float* res_out, TensorPtr out, float* mean, float* rstd, const float* res,
                                ConstTensorPtr inp, ConstTensorPtr weight, ConstTensorPtr bias, int64_t N, int C,
                                const DropoutMask& drop, cudaStream_t stream) {
  GPT_CHECK(res != nullptr && inp.data != nullptr);
  GPT_CHECK(out.data != res_out && out.data != res && out.data != inp.data);  // written after res_out is read back
  launch_layernorm_forward(out, mean, rstd, res_out, res, inp, drop, weight, bias, N, C, stream);
}

size_t layernorm_backward_scratch_bytes(int64_t N, int C) {
  GPT_CHECK(N >= 0 && C > 0);
  // Partials for kChunks, the most any N uses, so the size grows with N and C: scratch sized for the largest
  // shape also fits every smaller one (the exact chunk count is not monotonic in N).
  return cuda_workspace::layernorm_backward(N, C);
}

namespace {

template <typename W, typename G>
void launch_layernorm_backward(float* dinp, float* dweight, float* dbias, const G* dout, const float* inp,
                               const W* weight, const float* mean, const float* rstd, int64_t N, int C, bf16* dinp_lo,
                               void* scratch, cudaStream_t stream) {
  GPT_CHECK(N >= 0 && C > 0);
  GPT_CHECK(dinp != nullptr && dweight != nullptr && dbias != nullptr && dout != nullptr && inp != nullptr);
  GPT_CHECK(weight != nullptr && mean != nullptr && rstd != nullptr);
  GPT_CHECK(static_cast<const void*>(dinp) != dout && dinp != inp);  // read through __restrict__ pointers
  if (N == 0) return;
  GPT_CHECK(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % 16 == 0);

  const int64_t rpc = rows_per_chunk(N);
  const int chunks = static_cast<int>(ceil_div(N, rpc));  // <= kChunks, each chunk non-empty
  auto* partial = static_cast<float*>(scratch);
  const bool vec = C % 4 == 0 && aligned16(dinp) && aligned4(dout) && aligned16(inp) && aligned4(weight);
  // Four bf16 in one 8-byte store when every row's column 4k is 8-byte aligned.
  const bool lo_vec = C % 4 == 0 && reinterpret_cast<uintptr_t>(dinp_lo) % 8 == 0;
  const int warps = backward_warps(C);
  const size_t smem = static_cast<size_t>(warps) * 2 * C * sizeof(float);
  auto* kernel = vec ? layernorm_backward_kernel<true, W, G> : layernorm_backward_kernel<false, W, G>;
  set_smem(kernel, smem);
  kernel<<<static_cast<unsigned>(chunks), warps * kWarp, smem, stream>>>(dinp, dinp_lo, lo_vec, partial, dout, inp,
                                                                         weight, mean, rstd, N, C, rpc);
  GPT_CUDA_CHECK_LAUNCH();
  const dim3 param_grid(static_cast<unsigned>(ceil_div(2 * static_cast<int64_t>(C), kWarp)));
  layernorm_param_grad_kernel<<<param_grid, dim3(kWarp, kParamRows), 0, stream>>>(dweight, dbias, partial, chunks, C);
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_backward(float* dinp, float* dweight, float* dbias, ConstTensorPtr dout, const float* inp,
                        ConstTensorPtr weight, const float* mean, const float* rstd, int64_t N, int C, bf16* dinp_lo,
                        void* scratch, cudaStream_t stream) {
  with_dtype(weight, [&](auto* w) {
    with_dtype(dout, [&](auto* dy) {
      launch_layernorm_backward(dinp, dweight, dbias, dy, inp, w, mean, rstd, N, C, dinp_lo, scratch, stream);
    });
  });
}

}  // namespace gpt::cuda
