// CPU emulation of the CUDA execution model, enough for kernels/cuda/*.cu and cuda_backend.cu (README.md):
// one pooled OS thread per CUDA thread, std::barrier for __syncthreads, a per-warp exchange for shuffles and
// __syncwarp (all 32 lanes must arrive: divergent or out-of-step lanes abort), static and dynamic shared
// memory as exact-size heap buffers pre-filled with NaN (reading unwritten shared memory poisons results;
// ASan sees out-of-bounds), 3D grids and blocks. Blocks run one after another by default; EMU_CONC=n in the
// environment runs n blocks at once, so TSan can see races between blocks (manual sanitizer runs only).
// Everything here is host code; kernels run synchronously inside emulate_launch.
#pragma once
#include <algorithm>
#include <array>
#include <barrier>
#include <atomic>
#include <semaphore>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct emu_uint3 { unsigned x = 0, y = 0, z = 0; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned x, y; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
// A rounded product that is never contracted into an FMA (not inlined, so the host compiler cannot either).
[[gnu::noinline]] inline float __fmul_rn(float a, float b) { return a * b; }
inline thread_local emu_uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
inline thread_local float* emu_smem;
struct EmuWarp {
  explicit EmuWarp(std::ptrdiff_t lanes) : bar(lanes) {}  // the last warp of a block may be partial
  std::barrier<> bar;
  double slot[32];
  uint64_t gen[32] = {};
  float wa[256], wb[256], wc[256];
};
struct EmuBlock {
  std::mutex mu;
  std::vector<std::unique_ptr<unsigned char[]>> bufs;
  std::vector<size_t> sizes;
};
inline thread_local std::barrier<>* emu_block_bar;
inline thread_local EmuWarp* emu_warp;
inline thread_local EmuBlock* emu_block;
inline thread_local unsigned emu_static_idx;
inline thread_local uint64_t emu_shfl_gen;
inline thread_local unsigned emu_lane;
inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
// Static __shared__ arrays: the k-th declaration a thread executes is the block's k-th buffer.
inline void* emu_shared_alloc(size_t bytes) {
  const unsigned k = emu_static_idx++;
  std::lock_guard<std::mutex> g(emu_block->mu);
  if (emu_block->bufs.size() <= k) {
    auto* p = new unsigned char[bytes];
    for (size_t i = 0; i + 4 <= bytes; i += 4) { const float nan = NAN; std::memcpy(p + i, &nan, 4); }
    emu_block->bufs.emplace_back(p);
    emu_block->sizes.push_back(bytes);
  }
  if (emu_block->sizes[k] != bytes) { std::fprintf(stderr, "EMU: shared decl mismatch\n"); std::abort(); }
  return emu_block->bufs[k].get();
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int o) {
  if (mask != 0xffffffffu) { std::fprintf(stderr, "EMU: partial mask\n"); std::abort(); }
  const unsigned lane = emu_lane;
  const uint64_t g = ++emu_shfl_gen;
  emu_warp->slot[lane] = static_cast<double>(v);
  emu_warp->gen[lane] = g;
  emu_warp->bar.arrive_and_wait();
  if (emu_warp->gen[lane ^ o] != g) { std::fprintf(stderr, "EMU: shuffle from an inactive/out-of-step lane\n"); std::abort(); }
  const T r = static_cast<T>(emu_warp->slot[lane ^ o]);
  emu_warp->bar.arrive_and_wait();
  return r;
}
// All 32 lanes must reach the same warp-collective call (same per-lane call count).
inline void emu_warp_converge(const char* what) {
  const unsigned lane = emu_lane;
  const uint64_t g = ++emu_shfl_gen;
  emu_warp->gen[lane] = g;
  emu_warp->bar.arrive_and_wait();
  for (int i = 0; i < 32; ++i)
    if (emu_warp->gen[i] != g) { std::fprintf(stderr, "EMU: %s with diverged/inactive lanes\n", what); std::abort(); }
  emu_warp->bar.arrive_and_wait();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) { std::fprintf(stderr, "EMU: partial mask\n"); std::abort(); }
  emu_warp_converge("__syncwarp");
}
// grid_for's cap on the number of blocks (the real one by default); tests lower it to exercise grid-stride loops.
inline int64_t emu_grid_cap = 65535 * 8;
[[noreturn]] inline void emu_fail(const char* what) {
  std::fprintf(stderr, "EMU: %s\n", what);
  std::abort();
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
typedef int cudaError_t;
constexpr int cudaSuccess = 0;
typedef struct CUstream_st* cudaStream_t;
inline const char* cudaGetErrorString(int) { return "emu"; }
inline int cudaGetLastError() { return 0; }
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };
inline int cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) { std::memmove(d, s, n); return 0; }
inline int cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { std::memmove(d, s, n); return 0; }
// Device memory is host memory here, but cudaMalloc records each allocation, so the NCCL shim can check that
// it is given device buffers (emu_is_device), as the real NCCL needs.
struct EmuDeviceAllocs {
  std::mutex mu;
  std::map<uintptr_t, size_t> sizes;  // start -> bytes
};
inline EmuDeviceAllocs& emu_device_allocs() {
  static EmuDeviceAllocs* a = new EmuDeviceAllocs;  // never destroyed: frees may come from static destructors
  return *a;
}
inline bool emu_is_device(const void* p, size_t bytes) {
  EmuDeviceAllocs& a = emu_device_allocs();
  std::lock_guard<std::mutex> g(a.mu);
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = a.sizes.upper_bound(at);
  if (it == a.sizes.begin()) return false;
  --it;
  return at + bytes <= it->first + it->second;
}
inline int cudaMalloc(void** p, size_t n) {
  *p = std::aligned_alloc(256, n == 0 ? 256 : (n + 255) / 256 * 256);
  EmuDeviceAllocs& a = emu_device_allocs();
  std::lock_guard<std::mutex> g(a.mu);
  a.sizes[reinterpret_cast<uintptr_t>(*p)] = n;
  return 0;
}
template <class T>
int cudaMalloc(T** p, size_t n) {  // the runtime's typed overload
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline int cudaFree(void* p) {
  if (p == nullptr) return 0;
  {
    EmuDeviceAllocs& a = emu_device_allocs();
    std::lock_guard<std::mutex> g(a.mu);
    if (a.sizes.erase(reinterpret_cast<uintptr_t>(p)) != 1) {
      std::fprintf(stderr, "EMU: cudaFree of a pointer cudaMalloc did not return\n");
      std::abort();
    }
  }
  std::free(p);
  return 0;
}
inline int cudaStreamSynchronize(cudaStream_t) { return 0; }  // every emulated launch has finished on return
inline int cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t) { std::memset(d, v, n); return 0; }
// What cuda_backend.cu needs of the runtime: one emulated device; streams and events are tokens (every launch
// and copy has finished when its call returns, so waits are no-ops and elapsed times 0).
constexpr int cudaErrorCudartUnloading = 4;
constexpr int cudaErrorNotReady = 600;
constexpr unsigned cudaStreamNonBlocking = 1;
// One emulated device, or EMU_DEVICES of them (the NCCL tests run several ranks on one node, one "GPU" each).
inline int emu_device_count() {
  const char* n = std::getenv("EMU_DEVICES");
  return n != nullptr && std::atoi(n) > 0 ? std::atoi(n) : 1;
}
inline int cudaSetDevice(int device) { return device >= 0 && device < emu_device_count() ? 0 : 1; }
inline int cudaGetDeviceCount(int* n) { *n = emu_device_count(); return 0; }
struct cudaDeviceProp { char name[256] = "CUDA emulator"; };
inline int cudaGetDeviceProperties(cudaDeviceProp* p, int) { *p = cudaDeviceProp{}; return 0; }
inline int cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new char);
  return 0;
}
inline int cudaStreamDestroy(cudaStream_t s) { delete reinterpret_cast<char*>(s); return 0; }
typedef struct CUevent_st* cudaEvent_t;
inline int cudaEventCreate(cudaEvent_t* e) { *e = reinterpret_cast<cudaEvent_t>(new char); return 0; }
constexpr unsigned cudaEventDisableTiming = 2;
inline int cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) { return cudaEventCreate(e); }
inline int cudaEventQuery(cudaEvent_t) { return 0; }  // what it follows has finished
inline int cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned) { return 0; }
inline int cudaEventDestroy(cudaEvent_t e) { delete reinterpret_cast<char*>(e); return 0; }
inline int cudaEventRecord(cudaEvent_t, cudaStream_t) { return 0; }
inline int cudaEventSynchronize(cudaEvent_t) { return 0; }
inline int cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) { *ms = 0.0f; return 0; }
template <class T>
int cudaMallocHost(T** p, size_t n) {  // pinned host memory: not device memory
  *p = static_cast<T*>(std::aligned_alloc(256, (n + 255) / 256 * 256));
  return 0;
}
inline int cudaFreeHost(void* p) { std::free(p); return 0; }
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };
// Per kernel: the dynamic shared memory it was opted into (a launch past 48 KB without it fails on a GPU).
inline std::map<const void*, size_t>& emu_smem_optin() {
  static std::map<const void*, size_t> m;
  return m;
}
template <class... P>
int cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute, int bytes) {
  if (bytes < 0 || bytes > 227 * 1024) emu_fail("cudaFuncSetAttribute: more dynamic shared memory than an H100 has");
  emu_smem_optin()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(bytes);
  return 0;
}
inline long emu_launches = 0, emu_threads_total = 0;

// The OS threads that play CUDA threads, kept between launches (creating one per CUDA thread cost most of a
// launch). run(n, fn) calls fn(0..n-1) on n distinct threads at once, so a block's threads can meet at its
// barriers, and returns when all have returned. Called from one thread at a time (launches are synchronous).
class EmuThreadPool {
 public:
  static EmuThreadPool& instance() {
    static EmuThreadPool* pool = new EmuThreadPool;  // never destroyed: its threads outlive static destructors
    return *pool;
  }
  template <class F>
  void run(unsigned n, F& fn) {
    while (workers_.size() < n) {
      workers_.push_back(std::make_unique<Worker>());
      Worker* w = workers_.back().get();
      const unsigned idx = static_cast<unsigned>(workers_.size() - 1);
      std::thread([this, w, idx] { work(w, idx); }).detach();
    }
    task_ = [](void* f, unsigned t) { (*static_cast<F*>(f))(t); };
    fn_ = &fn;
    pending_.store(n);
    for (unsigned i = 0; i < n; ++i) workers_[i]->go.release();  // publishes task_/fn_ (release-acquire)
    done_.acquire();
  }

 private:
  struct Worker {
    std::binary_semaphore go{0};
  };
  void work(Worker* w, unsigned idx) {
    for (;;) {
      w->go.acquire();
      task_(fn_, idx);
      if (pending_.fetch_sub(1) == 1) done_.release();
    }
  }
  std::vector<std::unique_ptr<Worker>> workers_;
  void (*task_)(void*, unsigned) = nullptr;
  void* fn_ = nullptr;
  std::atomic<unsigned> pending_{0};
  std::binary_semaphore done_{0};
};

template <class... P, class... A>
void emulate_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t, A... args) {
  if (smem > 48 * 1024) {
    const auto it = emu_smem_optin().find(reinterpret_cast<const void*>(kernel));
    if (it == emu_smem_optin().end() || it->second < smem) emu_fail("launch with more than 48 KB of dynamic shared memory without cudaFuncSetAttribute");
  }
  const unsigned nthr = block.x * block.y * block.z;
  if (nthr > 1024 || nthr == 0 || grid.y > 65535 || grid.z > 65535 || grid.x == 0 || grid.y == 0 || grid.z == 0 || block.z > 64) {
    std::fprintf(stderr, "EMU: bad launch config grid(%u,%u,%u) block(%u,%u,%u)\n", grid.x, grid.y, grid.z, block.x, block.y, block.z);
    std::abort();
  }
  ++emu_launches;
  const char* ce = std::getenv("EMU_CONC");
  unsigned conc = ce ? std::atoi(ce) : 1;  // blocks run concurrently
  if (conc < 1) conc = 1;
  struct BlockState {
    struct FreeDel { void operator()(float* p) const { std::free(p); } };
    std::unique_ptr<float[], FreeDel> sm;
    std::unique_ptr<std::barrier<>> bar;
    std::vector<std::unique_ptr<EmuWarp>> warps;
    EmuBlock blk;
  };
  const uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
  for (uint64_t b0 = 0; b0 < nblocks; b0 += conc) {
    const uint64_t b1 = std::min<uint64_t>(nblocks, b0 + conc);
    std::vector<std::unique_ptr<BlockState>> states;
    for (uint64_t b = b0; b < b1; ++b) {
      auto st = std::make_unique<BlockState>();
      const size_t smem_alloc = smem == 0 ? 128 : (smem + 127) / 128 * 128;  // exact when smem is a multiple of 128
      st->sm.reset(static_cast<float*>(std::aligned_alloc(128, smem_alloc)));
      for (size_t i = 0; i < smem_alloc / sizeof(float); ++i) { const uint32_t pat = 0x7fc07fc0u; std::memcpy(&st->sm[i], &pat, 4); }
      st->bar = std::make_unique<std::barrier<>>(nthr);
      for (unsigned w = 0; w < (nthr + 31) / 32; ++w) st->warps.push_back(std::make_unique<EmuWarp>(std::min(32u, nthr - w * 32)));
      states.push_back(std::move(st));
    }
    auto one = [&](unsigned i) {
      const uint64_t b = b0 + i / nthr;
      const unsigned t = i % nthr;
      BlockState* st = states[b - b0].get();
      const unsigned bx = b % grid.x, by = (b / grid.x) % grid.y, bz = b / ((uint64_t)grid.x * grid.y);
      threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      blockIdx = {bx, by, bz};
      blockDim = block;
      gridDim = grid;
      emu_smem = st->sm.get();
      emu_block_bar = st->bar.get();
      emu_warp = st->warps[t / 32].get();
      emu_block = &st->blk;
      emu_static_idx = 0;
      emu_shfl_gen = 0;
      emu_lane = t % 32;
      kernel(static_cast<P>(args)...);
      emu_warp->bar.arrive_and_drop();
      emu_block_bar->arrive_and_drop();
    };
    const unsigned total = static_cast<unsigned>((b1 - b0) * nthr);
    EmuThreadPool::instance().run(total, one);
    emu_threads_total += total;
  }
}
