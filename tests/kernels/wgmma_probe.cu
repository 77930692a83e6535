// The wgmma probe (wgmma_probe.h), built for sm_90a only (tests/kernels/CMakeLists.txt).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/wgmma_ptx.cuh"
#include "kernels/wgmma_probe.h"

namespace gpt::cuda {
namespace {

constexpr int kTileBytes = 64 * kSw128Row;
constexpr size_t kSmem = 4 * kTileBytes + 1024;  // four tiles, and up to 1024 bytes to align the first

__device__ uint32_t pair(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
}

__global__ void __launch_bounds__(128)
    wgmma_probe_kernel(const uint16_t* a, const uint16_t* kt, const uint16_t* v, const uint16_t* at, float* d_ss,
                       float* d_rs, float* d_32, float* d_tt) {
  extern __shared__ __align__(1024) unsigned char wgmma_probe_smem[];
  unsigned char* base = align_1024(wgmma_probe_smem);
  unsigned char* ta = base;
  unsigned char* tk = base + kTileBytes;
  unsigned char* tv = base + 2 * kTileBytes;
  unsigned char* tat = base + 3 * kTileBytes;
  const int tid = static_cast<int>(threadIdx.x), w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  for (int e = tid; e < 64 * 64; e += 128) {
    const int r = e / 64, c = e % 64;
    *reinterpret_cast<uint16_t*>(ta + sw128_offset(r, c)) = a[e];
    *reinterpret_cast<uint16_t*>(tk + sw128_offset(r, c)) = kt[e];
    *reinterpret_cast<uint16_t*>(tv + sw128_offset(r, c)) = v[e];
    *reinterpret_cast<uint16_t*>(tat + sw128_offset(r, c)) = at[e];
  }
  fence_proxy_async();
  __syncthreads();

  float d[32];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_ss<64>(d, kmajor_desc(smem_u32(ta) + 32 * kk), kmajor_desc(smem_u32(tk) + 32 * kk), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(d);
  for (int i = 0; i < 32; ++i) d_ss[(16 * w + g + 8 * (i / 2 % 2)) * 64 + 8 * (i / 4) + 2 * t + i % 2] = d[i];

  uint32_t ra[4][4];  // A's registers for the 4 k-steps, by the table
  for (int kk = 0; kk < 4; ++kk) {
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * w + g + 8 * (r % 2), k = 16 * kk + 2 * t + 8 * (r / 2);
      ra[kk][r] = pair(a[row * 64 + k], a[row * 64 + k + 1]);
    }
  }
  float e[32];
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs_mn(e, ra[kk], mnmajor_desc(smem_u32(tv) + 2048 * kk), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(e);
  for (int i = 0; i < 32; ++i) d_rs[(16 * w + g + 8 * (i / 2 % 2)) * 64 + 8 * (i / 4) + 2 * t + i % 2] = e[i];

  float f[16];  // N = 32: the first 32 rows of kt
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_ss<32>(f, kmajor_desc(smem_u32(ta) + 32 * kk), kmajor_desc(smem_u32(tk) + 32 * kk), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(f);
  for (int i = 0; i < 16; ++i) d_32[(16 * w + g + 8 * (i / 2 % 2)) * 32 + 8 * (i / 4) + 2 * t + i % 2] = f[i];

  float x[32];  // both MN-major
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_ss<64, 1, 1>(x, mnmajor_desc(smem_u32(tat) + 2048 * kk), mnmajor_desc(smem_u32(tv) + 2048 * kk), kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operands(x);
  for (int i = 0; i < 32; ++i) d_tt[(16 * w + g + 8 * (i / 2 % 2)) * 64 + 8 * (i / 4) + 2 * t + i % 2] = x[i];
}

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* p = nullptr;
  GPT_CUDA_CHECK(cudaMalloc(&p, h.size() * sizeof(T)));
  GPT_CUDA_CHECK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

bool wgmma_probe_supported() {
  int device = 0, major = 0, minor = 0;
  GPT_CUDA_CHECK(cudaGetDevice(&device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  GPT_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major == 9 && minor == 0;
}

WgmmaProbeOut run_wgmma_probe(const WgmmaProbeIn& in) {
  GPT_CHECK(in.a.size() == 4096 && in.kt.size() == 4096 && in.v.size() == 4096 && in.at.size() == 4096);
  uint16_t* a = to_device(in.a);
  uint16_t* kt = to_device(in.kt);
  uint16_t* v = to_device(in.v);
  uint16_t* at = to_device(in.at);
  float* d[4] = {};  // d_ss, d_rs, d_32, d_tt; NaN where the kernel writes nothing
  for (float*& p : d) {
    GPT_CUDA_CHECK(cudaMalloc(&p, 4096 * sizeof(float)));
    GPT_CUDA_CHECK(cudaMemsetAsync(p, 0xff, 4096 * sizeof(float), nullptr));
  }
  GPT_CUDA_CHECK(
      cudaFuncSetAttribute(wgmma_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
  wgmma_probe_kernel<<<1, 128, kSmem, nullptr>>>(a, kt, v, at, d[0], d[1], d[2], d[3]);
  GPT_CUDA_CHECK_LAUNCH();
  GPT_CUDA_CHECK(cudaDeviceSynchronize());
  WgmmaProbeOut out;
  std::vector<float>* outs[4] = {&out.d_ss, &out.d_rs, &out.d_32, &out.d_tt};
  for (int i = 0; i < 4; ++i) {
    outs[i]->resize(i == 2 ? 2048 : 4096);
    GPT_CUDA_CHECK(cudaMemcpy(outs[i]->data(), d[i], outs[i]->size() * sizeof(float), cudaMemcpyDeviceToHost));
    GPT_CUDA_CHECK(cudaFree(d[i]));
  }
  for (uint16_t* p : {a, kt, v, at}) GPT_CUDA_CHECK(cudaFree(p));
  return out;
}

}  // namespace gpt::cuda
