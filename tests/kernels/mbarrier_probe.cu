// The mbarrier probe (mbarrier_probe.h), built for sm_90a only (tests/kernels/CMakeLists.txt).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mbarrier_ptx.cuh"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/mbarrier_probe.h"

namespace gpt::cuda {
namespace {

// Shared memory: the barriers (full[2], empty[2]), the flags (4 consumer warps' and the producer's), then per stage
// 128 floats by cp.async and 32 by plain stores.
constexpr int kStageFloats = 128 + 32;
constexpr size_t kSmem = 4 * sizeof(uint64_t) + 8 * sizeof(float) + 2 * kStageFloats * sizeof(float);

__global__ void __launch_bounds__(256)
    mbarrier_probe_kernel(const float* src, float* copied, float* stored, float* named) {
  extern __shared__ __align__(16) unsigned char mbarrier_probe_smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(mbarrier_probe_smem);
  uint64_t* empty = full + 2;
  float* flags = reinterpret_cast<float*>(empty + 2);  // [0, 4): the consumer warps', [4]: the producer's
  float* stages = flags + 8;                           // 16-byte aligned: 64 bytes in
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < 2; ++s) {
      mbarrier_init(&full[s], 64);  // 32 lanes' copies landing, 32 lanes' stores
      mbarrier_init(&empty[s], 4);  // the consumer warps
    }
  }
  __syncthreads();
  if (warp < 4) {  // the producer warpgroup: warp 0 alone
    if (warp != 0) return;
    for (int t = 0; t < kMbarrierProbeTiles; ++t) {
      const int s = t & 1;
      float* stage = stages + s * kStageFloats;
      if (t >= 2) mbarrier_wait(&empty[s], ((t >> 1) - 1) & 1);
      cp_async_16(stage + 4 * lane, src + 128 * t + 4 * lane, 16);
      cp_async_mbarrier_arrive_noinc(&full[s]);
      stage[128 + lane] = static_cast<float>(t * 1000 + lane);
      mbarrier_arrive(&full[s]);
    }
    if (lane == 0) flags[4] = 77.0f;
    named_barrier_arrive(2, 160);
    return;
  }
  const int w = warp - 4;
  for (int t = 0; t < kMbarrierProbeTiles; ++t) {
    const int s = t & 1;
    const float* stage = stages + s * kStageFloats;
    mbarrier_wait(&full[s], (t >> 1) & 1);
    copied[128 * t + 32 * w + lane] = stage[32 * w + lane];
    stored[(4 * t + w) * 32 + lane] = stage[128 + (lane ^ w)];
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&empty[s]);
  }
  if (lane == 0) flags[w] = static_cast<float>(w + 2);
  named_barrier_sync(1, 128);
  if (lane == 0) named[w] = flags[(w + 1) % 4];
  named_barrier_sync(2, 160);
  if (lane == 0) named[4 + w] = flags[4];
}

}  // namespace

MbarrierProbeOut run_mbarrier_probe(const std::vector<float>& src) {
  GPT_CHECK(src.size() == 128 * kMbarrierProbeTiles);
  const size_t n_copied = src.size(), n_stored = kMbarrierProbeTiles * 128, n_named = 8;
  float *d_src = nullptr, *d_copied = nullptr, *d_stored = nullptr, *d_named = nullptr;
  GPT_CUDA_CHECK(cudaMalloc(&d_src, n_copied * sizeof(float)));
  GPT_CUDA_CHECK(cudaMemcpy(d_src, src.data(), n_copied * sizeof(float), cudaMemcpyHostToDevice));
  GPT_CUDA_CHECK(cudaMalloc(&d_copied, n_copied * sizeof(float)));
  GPT_CUDA_CHECK(cudaMalloc(&d_stored, n_stored * sizeof(float)));
  GPT_CUDA_CHECK(cudaMalloc(&d_named, n_named * sizeof(float)));
  for (auto [p, n] : {std::pair{d_copied, n_copied}, std::pair{d_stored, n_stored}, std::pair{d_named, n_named}}) {
    GPT_CUDA_CHECK(cudaMemsetAsync(p, 0xff, n * sizeof(float), nullptr));  // NaN where nothing is written
  }
  mbarrier_probe_kernel<<<1, 256, kSmem, nullptr>>>(d_src, d_copied, d_stored, d_named);
  GPT_CUDA_CHECK_LAUNCH();
  GPT_CUDA_CHECK(cudaDeviceSynchronize());
  MbarrierProbeOut out{std::vector<float>(n_copied), std::vector<float>(n_stored), std::vector<float>(n_named)};
  GPT_CUDA_CHECK(cudaMemcpy(out.copied.data(), d_copied, n_copied * sizeof(float), cudaMemcpyDeviceToHost));
  GPT_CUDA_CHECK(cudaMemcpy(out.stored.data(), d_stored, n_stored * sizeof(float), cudaMemcpyDeviceToHost));
  GPT_CUDA_CHECK(cudaMemcpy(out.named.data(), d_named, n_named * sizeof(float), cudaMemcpyDeviceToHost));
  for (float* p : {d_src, d_copied, d_stored, d_named}) GPT_CUDA_CHECK(cudaFree(p));
  return out;
}

}  // namespace gpt::cuda
