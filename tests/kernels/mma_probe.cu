// The PTX probe (mma_probe.h). Fragment element i of a lane (g = lane / 4, t = lane % 4) sits in register i / 2,
// the lower index in the low half. The PTX ISA's tables:
//   A (.row): row = g for i in {0, 1, 4, 5}, else g + 8; col = 2 t + (i & 1), + 8 for i >= 4.
//   B (.col): row = 2 t + (i & 1), + 8 for i >= 2; col = g.
//   C, D:     row = g for i < 2, else g + 8; col = 2 t + (i & 1).
//   ldmatrix .x4: lanes 8 m .. 8 m + 7 give the row addresses of matrix m, and register m of lane 4 r + q holds
//   row r, columns 2 q and 2 q + 1 of that matrix (.trans: rows 2 q and 2 q + 1 of column r).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/mma_probe.h"

namespace gpt::cuda {
namespace {

constexpr int kLd = 24;  // shared tiles' row stride in b16 elements: 48 bytes, every row 16-byte aligned
constexpr int kTile = 16 * kLd;

struct Ptrs {
  const uint16_t *a, *b, *kt, *codes, *copy;
  const float *c, *lo, *hi;
  float *d_direct, *d_trans, *d_kt;
  uint32_t *ld, *ld_trans, *packed, *nearest;
  uint16_t* copied;
};

__device__ uint32_t pair(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
}

// d (2 x 16 x 8) from the lane's accumulators of n-tile nt, by the C/D table.
__device__ void store_d(float* d, int nt, const float (&acc)[4], int g, int t) {
  for (int i = 0; i < 4; ++i) d[(nt * 16 + (i < 2 ? g : g + 8)) * 8 + 2 * t + (i & 1)] = acc[i];
}

__device__ void init_c(float (&acc)[4], const float* c, int g, int t) {
  for (int i = 0; i < 4; ++i) acc[i] = c[(i < 2 ? g : g + 8) * 8 + 2 * t + (i & 1)];
}

__global__ void mma_probe_kernel(Ptrs p) {
  extern __shared__ __align__(16) uint16_t probe_smem[];
  uint16_t* sa = probe_smem;
  uint16_t* sb = sa + kTile;
  uint16_t* sk = sb + kTile;
  uint16_t* sc = sk + kTile;
  uint16_t* scopy = sc + kTile;  // 256
  const int lane = static_cast<int>(threadIdx.x), g = lane >> 2, t = lane & 3;

  // cp.async first: 16 bytes per lane, the odd lanes' zero-filled (source not read).
  cp_async_16(scopy + 8 * lane, p.copy + 8 * lane, lane % 2 == 0 ? 16u : 0u);
  cp_async_commit();
  for (int e = lane; e < 256; e += kWarp) {
    const int r = e / 16, c = e % 16;
    sa[r * kLd + c] = p.a[e];
    sb[r * kLd + c] = p.b[e];
    sk[r * kLd + c] = p.kt[e];
    sc[r * kLd + c] = p.codes[e];
  }
  cp_async_wait<0>();
  __syncthreads();
  for (int e = 0; e < 8; ++e) p.copied[8 * lane + e] = scopy[8 * lane + e];

  // Fragments element by element from global memory.
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) {
    uint16_t h[2];
    for (int k = 0; k < 2; ++k) {
      const int i = 2 * r + k;
      const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
      const int col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
      h[k] = p.a[row * 16 + col];
    }
    a[r] = pair(h[0], h[1]);
  }
  for (int nt = 0; nt < 2; ++nt) {
    uint32_t b[2];
    for (int r = 0; r < 2; ++r) {
      uint16_t h[2];
      for (int k = 0; k < 2; ++k) {
        const int i = 2 * r + k;
        const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
        h[k] = p.b[row * 16 + 8 * nt + g];
      }
      b[r] = pair(h[0], h[1]);
    }
    float acc[4];
    init_c(acc, p.c, g, t);
    mma_bf16_16816(acc, a, b[0], b[1]);
    store_d(p.d_direct, nt, acc, g, t);
  }

  // The same products with fragments from ldmatrix. Matrix m of A's four: rows 8 (m % 2).., columns 8 (m / 2)..;
  // of b (k x n) read transposed, the same corners (registers {0, 1}: n-tile 0; {2, 3}: n-tile 1); of kt (n x k),
  // rows 8 (m / 2).., columns 8 (m % 2)...
  const int m = lane >> 3, j = lane & 7;
  uint32_t al[4], bt[4], bk[4];
  ldmatrix_x4(al, sa + (8 * (m % 2) + j) * kLd + 8 * (m / 2));
  ldmatrix_x4_trans(bt, sb + (8 * (m % 2) + j) * kLd + 8 * (m / 2));
  ldmatrix_x4(bk, sk + (8 * (m / 2) + j) * kLd + 8 * (m % 2));
  for (int nt = 0; nt < 2; ++nt) {
    float acc[4];
    init_c(acc, p.c, g, t);
    mma_bf16_16816(acc, al, bt[2 * nt], bt[2 * nt + 1]);
    store_d(p.d_trans, nt, acc, g, t);
    init_c(acc, p.c, g, t);
    mma_bf16_16816(acc, al, bk[2 * nt], bk[2 * nt + 1]);
    store_d(p.d_kt, nt, acc, g, t);
  }

  // ldmatrix's moved bits: matrix m at rows 8 (m % 2).., columns 8 (m / 2).. of the code tile.
  uint32_t r[4], rt[4];
  ldmatrix_x4(r, sc + (8 * (m % 2) + j) * kLd + 8 * (m / 2));
  ldmatrix_x4_trans(rt, sc + (8 * (m % 2) + j) * kLd + 8 * (m / 2));
  for (int i = 0; i < 4; ++i) {
    p.ld[4 * lane + i] = r[i];
    p.ld_trans[4 * lane + i] = rt[i];
  }
  p.packed[lane] = pack_bf16x2(p.lo[lane], p.hi[lane]);
  p.nearest[lane] = bf16x2_nearest(p.lo[lane], p.hi[lane]);
}

// Device copies of the inputs and poisoned outputs; every allocation is freed with the object.
struct DeviceArena {
  std::vector<void*> blocks;
  ~DeviceArena() {
    for (void* q : blocks) cudaFree(q);
  }
  template <typename T>
  T* alloc(size_t n) {
    void* d = nullptr;
    GPT_CUDA_CHECK(cudaMalloc(&d, n * sizeof(T)));
    blocks.push_back(d);
    return static_cast<T*>(d);
  }
  template <typename T>
  const T* upload(const std::vector<T>& host, size_t n) {
    GPT_CHECK_MSG(host.size() == n, "mma probe: an input of the wrong size");
    T* d = alloc<T>(n);
    GPT_CUDA_CHECK(cudaMemcpy(d, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    return d;
  }
  template <typename T>
  T* poisoned(size_t n) {  // NaN, or all ones: an element the kernel never writes shows
    T* d = alloc<T>(n);
    GPT_CUDA_CHECK(cudaMemsetAsync(d, 0xff, n * sizeof(T), nullptr));
    return d;
  }
};

template <typename T>
std::vector<T> download(const T* d, size_t n) {
  std::vector<T> h(n);
  GPT_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

MmaProbeOut run_mma_probe(const MmaProbeIn& in) {
  DeviceArena arena;
  Ptrs p{};
  p.a = arena.upload(in.a, 256);
  p.b = arena.upload(in.b, 256);
  p.kt = arena.upload(in.kt, 256);
  p.codes = arena.upload(in.codes, 256);
  p.copy = arena.upload(in.copy, 256);
  p.c = arena.upload(in.c, 128);
  p.lo = arena.upload(in.lo, 32);
  p.hi = arena.upload(in.hi, 32);
  p.d_direct = arena.poisoned<float>(256);
  p.d_trans = arena.poisoned<float>(256);
  p.d_kt = arena.poisoned<float>(256);
  p.ld = arena.poisoned<uint32_t>(128);
  p.ld_trans = arena.poisoned<uint32_t>(128);
  p.packed = arena.poisoned<uint32_t>(32);
  p.nearest = arena.poisoned<uint32_t>(32);
  p.copied = arena.poisoned<uint16_t>(256);
  const size_t smem = (4 * kTile + 256) * sizeof(uint16_t);
  mma_probe_kernel<<<1, kWarp, smem, nullptr>>>(p);
  GPT_CUDA_CHECK_LAUNCH();
  GPT_CUDA_CHECK(cudaDeviceSynchronize());
  MmaProbeOut out;
  out.d_direct = download(p.d_direct, 256);
  out.d_trans = download(p.d_trans, 256);
  out.d_kt = download(p.d_kt, 256);
  out.ld = download(p.ld, 128);
  out.ld_trans = download(p.ld_trans, 128);
  out.packed = download(p.packed, 32);
  out.nearest = download(p.nearest, 32);
  out.copied = download(p.copied, 256);
  return out;
}

}  // namespace gpt::cuda
