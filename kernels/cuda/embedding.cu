// Token + position embedding on the GPU, the twin of kernels/cpu/embedding.cc. Backward is deterministic
// without atomics: dwpe[t] adds dout[b, t] over b in order; for dwte the positions are stably radix-sorted
// by token id (cub), and each run of equal tokens adds its dout rows in position order into its dwte row,
// threads spread over the channels. Both add into the gradient's running value in the CPU's order, so they
// match it bit for bit.
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "core/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace gpt::cuda {
namespace {

constexpr int kRowThreads = 128;       // per block in the one-block-per-row kernels
constexpr int kWteThreads = 256;       // per block in the dwte kernel: GPT-2's 768 channels (192 float4) in one pass
constexpr int kThreads = 256;          // per block in the elementwise kernels
constexpr size_t kScratchAlign = 256;  // each scratch piece starts on a 256-byte boundary

// Four consecutive table entries as fp32: one float4, or one 8-byte piece of 4 bf16 (widened).
__device__ inline float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ inline float4 load4(const bf16* p) {
  float v[4];
  load4_bf16(v, p);
  return make_float4(v[0], v[1], v[2], v[3]);
}

// out[row] = wte[tokens[row]] + wpe[row % T], one block per row. W: the tables' type, float or bf16 (read widened,
// so the sums are the fp32 tables' bit for bit). kVec: C % 4 == 0 and the pointers aligned to 4 entries (16 bytes
// for fp32, 8 for bf16), so a row is C / 4 pieces of 4.
template <bool kVec, typename W>
__global__ void __launch_bounds__(kRowThreads)
    embedding_forward_kernel(float* __restrict__ out, const int32_t* __restrict__ tokens, const W* __restrict__ wte,
                             const W* __restrict__ wpe, int T, int C) {
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % T);
  const W* te = wte + static_cast<int64_t>(tokens[row]) * C;
  const W* pe = wpe + static_cast<int64_t>(t) * C;
  float* o = out + row * C;
  if constexpr (kVec) {
    for (int c = threadIdx.x; c < C / 4; c += kRowThreads) {
      const float4 a = load4(te + 4 * c);
      const float4 b = load4(pe + 4 * c);
      reinterpret_cast<float4*>(o)[c] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    }
  } else {
    for (int c = threadIdx.x; c < C; c += kRowThreads) o[c] = load_value(te + c) + load_value(pe + c);
  }
}

// dwpe[t, c] += dout[0, t, c] + dout[1, t, c] + ... in b order, one thread per (t, c) (or per float4).
template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    embedding_backward_wpe_kernel(float* __restrict__ dwpe, const float* __restrict__ dout, int B, int T, int C) {
  const int64_t row_elems = static_cast<int64_t>(T) * C;  // one b's slice of dout, and all of dwpe
  const int64_t n = kVec ? row_elems / 4 : row_elems;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n; e += stride) {
    if constexpr (kVec) {
      float4 acc = reinterpret_cast<const float4*>(dwpe)[e];
      for (int b = 0; b < B; ++b) {
        const float4 d = reinterpret_cast<const float4*>(dout + b * row_elems)[e];
        acc.x += d.x;
        acc.y += d.y;
        acc.z += d.z;
        acc.w += d.w;
      }
      reinterpret_cast<float4*>(dwpe)[e] = acc;
    } else {
      float acc = dwpe[e];
      for (int b = 0; b < B; ++b) acc += dout[b * row_elems + e];
      dwpe[e] = acc;
    }
  }
}

// values_in[i] = i: the positions that the sort carries along with their token ids.
__global__ void __launch_bounds__(kThreads) iota_kernel(int32_t* __restrict__ values, int n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    values[i] = static_cast<int32_t>(i);
  }
}

// One block per sorted index i; the block of a run's first index (a segment head) owns that token's dwte
// row, and each thread walks the run's positions in order (the sort is stable, so they are ascending) for
// its channels. Blocks of other indices leave at once. Each dwte row is written by exactly one block.
//
// A frequent token's run is long (a few percent of the rows in real text: hundreds at B*T = 16k) and its block
// ends last, so the walk keeps kBatch rows' loads in flight (added in order: the same sums), and the run's end is
// found kWteThreads keys at a time (the keys are sorted, so a window's matches are a prefix of it). Its threads
// cover the channels in one pass where C / 4 <= kWteThreads (a second pass would walk the run again). At least 4
// blocks per SM, not 8: ptxas then leaves registers for the batch's loads (60 on sm_90; fitting 8 blocks it takes
// 32, too few to keep 8 float4 loads in flight).
constexpr int kBatch = 8;

template <typename Acc>
__device__ inline void add_to(Acc& acc, const Acc& d) {
  if constexpr (std::is_same_v<Acc, float4>) {
    acc.x += d.x;
    acc.y += d.y;
    acc.z += d.z;
    acc.w += d.w;
  } else {
    acc += d;
  }
}

// acc += rows [i, end) of the run at column c of dout viewed as Acc (float4 or float) rows of `row` elements.
template <typename Acc>
__device__ inline Acc sum_run(Acc acc, const Acc* __restrict__ dout, const int32_t* __restrict__ positions, int i,
                              int end, int64_t row, int c) {
  int k = i;
  for (; k + kBatch <= end; k += kBatch) {
    Acc d[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) d[u] = dout[static_cast<int64_t>(positions[k + u]) * row + c];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) add_to(acc, d[u]);
  }
  for (; k < end; ++k) add_to(acc, dout[static_cast<int64_t>(positions[k]) * row + c]);
  return acc;
}

template <bool kVec>
__global__ void __launch_bounds__(kWteThreads, 4)
    embedding_backward_wte_kernel(float* __restrict__ dwte, const float* __restrict__ dout,
                                  const int32_t* __restrict__ keys, const int32_t* __restrict__ positions, int n,
                                  int C) {
  __shared__ int window_matches[1];
  const int i = blockIdx.x;
  const int32_t token = keys[i];
  if (i > 0 && keys[i - 1] == token) return;  // not a segment head; uniform over the block
  int end = i + 1;
  for (;;) {
    if (threadIdx.x == 0) window_matches[0] = kWteThreads;
    __syncthreads();
    const int j = end + static_cast<int>(threadIdx.x);
    const bool match = j < n && keys[j] == token;
    // The window's first non-match (at most one thread) says how many matched.
    if (!match && (threadIdx.x == 0 || (j - 1 < n && keys[j - 1] == token))) window_matches[0] = threadIdx.x;
    __syncthreads();
    const int matched = window_matches[0];
    __syncthreads();  // every thread has read it before thread 0 resets it
    end += matched;
    if (matched < kWteThreads) break;
  }
  float* te = dwte + static_cast<int64_t>(token) * C;
  if constexpr (kVec) {
    const auto* d4 = reinterpret_cast<const float4*>(dout);
    for (int c = threadIdx.x; c < C / 4; c += kWteThreads) {
      reinterpret_cast<float4*>(te)[c] =
          sum_run(reinterpret_cast<const float4*>(te)[c], d4, positions, i, end, C / 4, c);
    }
  } else {
    for (int c = threadIdx.x; c < C; c += kWteThreads) te[c] = sum_run(te[c], dout, positions, i, end, C, c);
  }
}

size_t align_up(size_t n) { return (n + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }

// Scratch layout, each piece 256-byte aligned: sorted keys (n int32), positions in (n), positions out (n),
// then cub's temporary storage. The sort reads its keys straight from `tokens`.
struct SortScratch {
  int32_t* keys_out;
  int32_t* values_in;
  int32_t* values_out;
  void* temp;
  size_t temp_bytes;
};

// cub's temporary storage for sorting n (int32 key, int32 value) pairs on all 32 key bits. With a null
// temp pointer cub only computes the size (host code; it queries the current device, launches nothing).
size_t sort_temp_bytes(int n) {
  size_t bytes = 0;
  GPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                 static_cast<int32_t*>(nullptr), n, 0, 32));
  return bytes;
}

SortScratch sort_scratch(void* scratch, int n) {
  const size_t piece = align_up(static_cast<size_t>(n) * sizeof(int32_t));
  char* p = static_cast<char*>(scratch);
  return SortScratch{reinterpret_cast<int32_t*>(p), reinterpret_cast<int32_t*>(p + piece),
                     reinterpret_cast<int32_t*>(p + 2 * piece), p + 3 * piece, sort_temp_bytes(n)};
}

int rows(int B, int T) {
  const int64_t n = static_cast<int64_t>(B) * T;
  GPT_CHECK(n <= INT32_MAX - kWteThreads);  // one block per row; int32 positions (and the run scan's window)
  return static_cast<int>(n);
}

}  // namespace

namespace {

template <typename W>
void launch_embedding_forward(float* out, const int32_t* tokens, const W* wte, const W* wpe, int B, int T, int C,
                              cudaStream_t stream) {
  GPT_CHECK(B >= 0 && T > 0 && C > 0);
  GPT_CHECK(out != nullptr && tokens != nullptr && wte != nullptr && wpe != nullptr);
  const int n = rows(B, T);
  if (n == 0) return;
  const bool vec = C % 4 == 0 && aligned16(out) && aligned4(wte) && aligned4(wpe);
  if (vec) {
    embedding_forward_kernel<true, W><<<n, kRowThreads, 0, stream>>>(out, tokens, wte, wpe, T, C);
  } else {
    embedding_forward_kernel<false, W><<<n, kRowThreads, 0, stream>>>(out, tokens, wte, wpe, T, C);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(float* out, const int32_t* tokens, ConstTensorPtr wte, ConstTensorPtr wpe, int B, int T, int C,
                       cudaStream_t stream) {
  GPT_CHECK_MSG(wte.dtype == wpe.dtype, "embedding_forward: wte and wpe of different dtypes");
  if (wte.is_bf16()) {
    launch_embedding_forward(out, tokens, wte.as_bf16(), wpe.as_bf16(), B, T, C, stream);
  } else {
    launch_embedding_forward(out, tokens, wte.as_f32(), wpe.as_f32(), B, T, C, stream);
  }
}

size_t embedding_backward_scratch_bytes(int B, int T) {
  GPT_CHECK(B >= 0 && T > 0);
  const int n = rows(B, T);
  return cuda_workspace::embedding_backward_fixed(n) + align_up(sort_temp_bytes(n));
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C,
                        void* scratch, cudaStream_t stream) {
  GPT_CHECK(B >= 0 && T > 0 && C > 0);
  GPT_CHECK(dwte != nullptr && dwpe != nullptr && dout != nullptr && tokens != nullptr);
  const int n = rows(B, T);
  if (n == 0) return;
  GPT_CHECK(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % alignof(int32_t) == 0);

  // dwpe: independent of the sort.
  const int64_t wpe_elems = static_cast<int64_t>(T) * C;
  if (C % 4 == 0 && aligned16(dwpe) && aligned16(dout)) {
    embedding_backward_wpe_kernel<true>
        <<<grid_for(wpe_elems / 4, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  } else {
    embedding_backward_wpe_kernel<false><<<grid_for(wpe_elems, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  }
  GPT_CUDA_CHECK_LAUNCH();

  // dwte: sort (token, position) pairs by token, stably, then one pass over the runs of equal tokens.
  SortScratch s = sort_scratch(scratch, n);
  iota_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(s.values_in, n);
  GPT_CUDA_CHECK_LAUNCH();
  GPT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(s.temp, s.temp_bytes, tokens, s.keys_out, s.values_in, s.values_out, n,
                                                 0, 32, stream));
  GPT_CUDA_CHECK_LAUNCH();
  if (C % 4 == 0 && aligned16(dwte) && aligned16(dout)) {
    embedding_backward_wte_kernel<true><<<n, kWteThreads, 0, stream>>>(dwte, dout, s.keys_out, s.values_out, n, C);
  } else {
    embedding_backward_wte_kernel<false><<<n, kWteThreads, 0, stream>>>(dwte, dout, s.keys_out, s.values_out, n, C);
  }
  GPT_CUDA_CHECK_LAUNCH();
}

}  // namespace gpt::cuda
