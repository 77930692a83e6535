// AdamW over a flat fp32 shard and the sum of squares for the global gradient norm: the twins of
// adamw_update and sum_squares in kernels/cpu/elementwise.cc. The bias corrections are computed on the host
// exactly as the CPU does. sum_squares is deterministic: a fixed grid of blocks, each thread striding with
// a fixed stride, partial sums in double written per block, then one block adding them in block order.
#include <cmath>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kSumBlocks = cuda_workspace::kSumBlocks;  // fixed, so the summation order never depends on the GPU

// The optimizer's elements, kBatch at a time per thread: the batch's grad, m, v and param are all loaded before any
// store (the compiler may not move a load above a store to another array: it cannot rule out that they overlap), so
// a thread has 4 kBatch loads in flight instead of two dependent round trips per element. Each element's
// arithmetic is unchanged, and so are the results, bit for bit.
constexpr int kBatch = 4;
struct AdamWIn {
  float g, m, v, p;
};
template <typename Finish>
__device__ inline void adamw_batched(const float* param, const float* m, const float* v, const float* grad,
                                     int64_t first, int64_t last, int64_t stride, Finish finish) {
  for (int64_t base = first; base < last; base += kBatch * stride) {
    AdamWIn in[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = base + b * stride;
      if (i < last) in[b] = {grad[i], m[i], v[i], param[i]};
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t i = base + b * stride;
      if (i < last) finish(i, in[b]);
    }
  }
}

__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float grad_scale, float bc1, float bc2) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  adamw_batched(param, m, v, grad, blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x, n, stride,
                [&](int64_t i, const AdamWIn& in) {
                  const float g = in.g * grad_scale;
                  const float mi = beta1 * in.m + (1.0f - beta1) * g;
                  const float vi = beta2 * in.v + (1.0f - beta2) * g * g;
                  m[i] = mi;
                  v[i] = vi;
                  const float mhat = mi / bc1, vhat = vi / bc2;
                  param[i] = in.p - lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * in.p);
                });
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

// The multi-tensor kernels: one launch over every span of the shard. Each block takes one tile of kTile
// elements of one span; tile_start (count + 1, a prefix sum of the spans' tile counts) maps the block to its
// span by binary search.
constexpr int64_t kTile = cuda_workspace::kOptimTile;
static_assert(sizeof(OptimSpan) == cuda_workspace::kOptimSpanBytes);

__device__ inline int span_of_block(const int64_t* tile_start, int count, int64_t block) {
  int lo = 0, hi = count - 1;  // the last k with tile_start[k] <= block
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (tile_start[mid] <= block) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Rounds x to bf16: nearest even (elementwise.cu's cast), or stochastically with the bits of model index `at`.
__device__ inline bf16 round_bf16(float x, const Bf16Rounding& r, uint64_t at) {
  const uint32_t u = __float_as_uint(x);
  bf16 out;
  if (r.stochastic) {
    out.bits = bf16_bits_stochastic(u, r.rng.u32(at));
  } else if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) {
    out.bits = static_cast<uint16_t>((u >> 16) | 0x40);
  } else {
    out.bits = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  return out;
}

// The tile of span k that block `block` owns: [first, last) in the local buffers.
struct Tile {
  const OptimSpan* span;
  int64_t first, last;
};
__device__ inline Tile tile_of(const OptimSpan* spans, const int64_t* tile_start, int count, int64_t block) {
  const int k = span_of_block(tile_start, count, block);
  const int64_t t = block - tile_start[k];
  const int64_t first = spans[k].begin + t * kTile;
  const int64_t end = spans[k].begin + spans[k].length;
  return {&spans[k], first, first + kTile < end ? first + kTile : end};
}

// adamw_kernel's arithmetic per element (bit for bit), plus the bf16 copy.
__global__ void adamw_spans_kernel(float* param, float* m, float* v, const float* grad, bf16* param_lo,
                                   const OptimSpan* spans, const int64_t* tile_start, int count, AdamWStep s, float bc1,
                                   float bc2, Bf16Rounding rounding) {
  const Tile tile = tile_of(spans, tile_start, count, blockIdx.x);
  const float wd = tile.span->decay ? s.weight_decay : 0.0f;
  // The span's fields read once (a store may alias them, as far as the compiler knows).
  const int64_t lo_shift = tile.span->lo_shift, begin = tile.span->begin;
  const uint64_t index = tile.span->index;
  adamw_batched(param, m, v, grad, tile.first + threadIdx.x, tile.last, blockDim.x, [&](int64_t i, const AdamWIn& in) {
    const float g = in.g * s.grad_scale;
    const float mi = s.beta1 * in.m + (1.0f - s.beta1) * g;
    const float vi = s.beta2 * in.v + (1.0f - s.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    const float p = in.p - s.lr * (mhat / (sqrtf(vhat) + s.eps) + wd * in.p);
    param[i] = p;
    if (param_lo != nullptr) param_lo[i + lo_shift] = round_bf16(p, rounding, index + (i - begin));
  });
}

__global__ void round_spans_kernel(bf16* dst, const float* src, const OptimSpan* spans, const int64_t* tile_start,
                                   int count, Bf16Rounding rounding) {
  const Tile tile = tile_of(spans, tile_start, count, blockIdx.x);
  for (int64_t i = tile.first + threadIdx.x; i < tile.last; i += blockDim.x) {
    dst[i + tile.span->lo_shift] = round_bf16(src[i], rounding, tile.span->index + (i - tile.span->begin));
  }
}

// One double partial per tile (block order fixed by the spans), summed by sum_partials_kernel.
__global__ void sum_squares_spans_kernel(double* partial, const float* x, const OptimSpan* spans,
                                         const int64_t* tile_start, int count) {
  __shared__ double shared[32];
  const Tile tile = tile_of(spans, tile_start, count, blockIdx.x);
  double acc = 0.0;
  for (int64_t i = tile.first + threadIdx.x; i < tile.last; i += blockDim.x) acc += static_cast<double>(x[i]) * x[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

size_t align_up(size_t n) { return cuda_workspace::align_up(n); }

// The live spans (those with elements: a span owns ceil(length / kTile) tiles) and their tile prefix.
void live_spans(const std::vector<OptimSpan>& spans, std::vector<OptimSpan>& live, std::vector<int64_t>& starts) {
  live.clear();
  starts.clear();
  int64_t tiles = 0;
  for (const OptimSpan& sp : spans) {
    GPT_CHECK(sp.begin >= 0 && sp.length >= 0);
    if (sp.length == 0) continue;
    live.push_back(sp);
    starts.push_back(tiles);
    tiles += (sp.length + kTile - 1) / kTile;
  }
  starts.push_back(tiles);
}

}  // namespace

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int64_t step, cudaStream_t stream) {
  GPT_CHECK(step >= 1);
  if (n == 0) return;
  const float bc1 = 1.0f - std::pow(beta1, static_cast<float>(step));
  const float bc2 = 1.0f - std::pow(beta2, static_cast<float>(step));
  adamw_kernel<<<grid_for(ceil_div(n, kBatch), kThreads), kThreads, 0, stream>>>(
      param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, bc1, bc2);
  GPT_CUDA_CHECK_LAUNCH();
}

size_t sum_squares_scratch_bytes() { return cuda_workspace::sum_squares(); }

void sum_squares(double* result, const float* x, int64_t n, void* scratch, cudaStream_t stream) {
  auto* partial = static_cast<double*>(scratch);
  sum_squares_partial_kernel<<<kSumBlocks, kThreads, 0, stream>>>(partial, x, n);
  GPT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(result, partial, kSumBlocks);
  GPT_CUDA_CHECK_LAUNCH();
}

size_t span_table_bytes(const std::vector<OptimSpan>& spans) {
  return cuda_workspace::span_table(static_cast<int64_t>(spans.size()));
}

SpanTable write_span_table(const std::vector<OptimSpan>& spans, void* device, cudaStream_t stream) {
  std::vector<OptimSpan> live;
  std::vector<int64_t> starts;
  live_spans(spans, live, starts);
  SpanTable t;
  t.count = static_cast<int>(live.size());
  t.tiles = starts.back();
  if (t.count == 0) return t;
  GPT_CHECK(t.tiles <= INT32_MAX);
  char* base = static_cast<char*>(device);
  const size_t spans_bytes = align_up(live.size() * sizeof(OptimSpan));
  GPT_CUDA_CHECK(cudaMemcpyAsync(base, live.data(), live.size() * sizeof(OptimSpan), cudaMemcpyHostToDevice, stream));
  GPT_CUDA_CHECK(cudaMemcpyAsync(base + spans_bytes, starts.data(), starts.size() * sizeof(int64_t),
                                 cudaMemcpyHostToDevice, stream));
  GPT_CUDA_CHECK(cudaStreamSynchronize(stream));  // live and starts are this function's
  t.spans = reinterpret_cast<const OptimSpan*>(base);
  t.tile_start = reinterpret_cast<const int64_t*>(base + spans_bytes);
  return t;
}

void adamw_update_spans(float* param, float* m, float* v, const float* grad, bf16* param_lo, const SpanTable& t,
                        const AdamWStep& s, const Bf16Rounding& rounding, cudaStream_t stream) {
  GPT_CHECK(s.step >= 1);
  if (t.count == 0) return;
  // The bias corrections as adamw_update (and the CPU) computes them.
  const float bc1 = 1.0f - std::pow(s.beta1, static_cast<float>(s.step));
  const float bc2 = 1.0f - std::pow(s.beta2, static_cast<float>(s.step));
  adamw_spans_kernel<<<static_cast<unsigned>(t.tiles), kThreads, 0, stream>>>(
      param, m, v, grad, param_lo, t.spans, t.tile_start, t.count, s, bc1, bc2, rounding);
  GPT_CUDA_CHECK_LAUNCH();
}

void round_to_bf16_spans(bf16* dst, const float* src, const SpanTable& t, const Bf16Rounding& rounding,
                         cudaStream_t stream) {
  if (t.count == 0) return;
  round_spans_kernel<<<static_cast<unsigned>(t.tiles), kThreads, 0, stream>>>(dst, src, t.spans, t.tile_start, t.count,
                                                                              rounding);
  GPT_CUDA_CHECK_LAUNCH();
}

size_t sum_squares_spans_scratch_bytes(const SpanTable& t) { return cuda_workspace::sum_squares_spans(t.tiles); }

void sum_squares_spans(double* result, const float* x, const SpanTable& t, void* scratch, cudaStream_t stream) {
  if (t.count == 0) {
    GPT_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(double), stream));
    return;
  }
  auto* partial = static_cast<double*>(scratch);
  sum_squares_spans_kernel<<<static_cast<unsigned>(t.tiles), kThreads, 0, stream>>>(partial, x, t.spans, t.tile_start,
                                                                                    t.count);
  GPT_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreads, 0, stream>>>(result, partial, static_cast<int>(t.tiles));
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
