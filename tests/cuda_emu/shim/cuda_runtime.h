// CPU emulation of the CUDA execution model, enough for kernels/cuda/*.cu and the backend (README.md):
// the threads of a block are fibers on one OS thread (emu_fiber.h), switching only at barriers: an EmuBarrier
// for __syncthreads, a per-warp exchange for shuffles and __syncwarp (all 32 lanes must arrive: divergent or
// out-of-step lanes abort; a barrier no live thread can pass aborts as a deadlock), static and dynamic shared
// memory as exact-size heap buffers pre-filled with NaN (reading unwritten shared memory poisons results;
// ASan sees out-of-bounds), 3D grids and blocks. Blocks run one after another by default; EMU_CONC=n in the
// environment runs n blocks at once on n OS threads, so TSan can see races between blocks (manual sanitizer
// runs only). Everything here is host code; a launch runs inside emulate_launch on the legacy stream and when
// its stream is needed on a created one (see "Streams" in emu_runtime_api.h).
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <semaphore>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "emu_fiber.h"
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// kernels/cuda/mma_ptx.cuh takes the emulated instructions (emu_ptx.h) instead of its inline PTX.
#define GPT_CUDA_EMULATOR 1
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct emu_uint3 { unsigned x = 0, y = 0, z = 0; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline uint32_t __float_as_uint(float f) { return std::bit_cast<uint32_t>(f); }
inline float __uint_as_float(uint32_t u) { return std::bit_cast<float>(u); }
// A rounded product that is never contracted into an FMA (not inlined, so the host compiler cannot either).
[[gnu::noinline]] inline float __fmul_rn(float a, float b) { return a * b; }
inline thread_local emu_uint3 threadIdx, blockIdx;
inline thread_local dim3 blockDim, gridDim;
inline thread_local float* emu_smem;
// A barrier over `n` CUDA threads of one block (fibers of one OS thread, so no atomics): __syncthreads for the
// block, and one per warp for the warp collectives. A thread that returns drops out (arrive_and_drop), as on
// Volta and later. Waiting yields to the block's other threads, saving and restoring this thread's
// thread_locals (threadIdx, ...) around it: they are the OS thread's, shared by all its fibers.
class EmuBarrier {
 public:
  explicit EmuBarrier(unsigned n) : expected_(n) {}
  EmuBarrier(const EmuBarrier&) = delete;
  EmuBarrier& operator=(const EmuBarrier&) = delete;
  void arrive_and_wait();
  void arrive_and_drop();

 private:
  uint64_t phase() const {
    EmuTsanIgnore ignore;
    return gen_;
  }
  void complete() {  // REQUIRES: TSan ignoring (the counters are the emulator's)
    arrived_ = 0;
    ++gen_;
    emu_fiber_woke();
  }
  unsigned expected_, arrived_ = 0;
  uint64_t gen_ = 0;
  char sync_[2] = {};  // TSan sync objects, one per phase parity (phase g+2 starts only after all left g)
};
struct EmuWarp {
  explicit EmuWarp(unsigned lanes) : bar(lanes) {}  // the last warp of a block may be partial
  EmuBarrier bar;
  double slot[32];
  uint64_t gen[32] = {};
  float wa[256], wb[256], wc[256];
  const void* ptr[32];  // ldmatrix: each lane's row address
};
// One cp.async (emu_ptx.h): `bytes` to dst, the first `src_bytes` of them from src and the rest zeros.
struct EmuAsyncCopy {
  void* dst;
  const void* src;
  unsigned bytes, src_bytes;
};
// A thread's cp.async copies: those not yet committed, and the committed groups, oldest first.
struct EmuAsyncCopies {
  std::vector<EmuAsyncCopy> open;
  std::deque<std::vector<EmuAsyncCopy>> groups;
};
// A thread's wgmma results not yet retired by a wgmma.wait_group (emu_ptx.h): per product, where and what, and its
// operands (to compute it again at the retirement: operands changed in flight are an error).
struct EmuWgmmaResult {
  float* d;
  int n;
  float v[64];  // N / 2 of them (N up to 128)
  const uint32_t* a;  // A's registers, or null: A from desc_a
  uint64_t desc_a, desc_b;
  bool a_mn, b_mn, accumulate;
  float in[64];  // the accumulators' input
};
// The warpgroup as a whole: every wgmma instruction (mma_async, commit_group, wait_group) is the warpgroup's, so its
// 128 threads must issue the same ones in the same order with the same operands (descriptors, shape, flags); each
// thread keeps the sequence it issued (trace), compared within each warpgroup when the block ends
// (emu_wgmma_check_block): a warp that skipped a product, or took a descriptor of its own, fails there.
struct EmuWgmmaOp {
  // 0 mma_async (n: N, flags: A from registers, A MN-major, B MN-major, accumulate), 1 commit, 2 wait (n), 3 setmaxnreg
  // (n: the count; a warpgroup instruction too, so in the same trace)
  int kind;
  int n, flags;
  uint64_t desc_a, desc_b;
  bool operator==(const EmuWgmmaOp&) const = default;
};
struct EmuWgmmaState {
  std::vector<EmuWgmmaResult> open;                 // since the last commit
  std::deque<std::vector<EmuWgmmaResult>> groups;  // committed, oldest first
  std::vector<EmuWgmmaOp> trace;                    // every wgmma instruction this thread issued, in order
};
// An mbarrier object (emu_ptx.h): its arrival count, the arrivals its current phase still waits for, the phases
// completed, and the cp.async copies whose completion the current phase tracks (cp.async.mbarrier.arrive.noinc: they
// land when it completes). `magic`: what mbarrier.init wrote into its 8 bytes of shared memory (checked at each use:
// a kernel that overwrote them with data corrupted the barrier on a GPU).
struct EmuMbarrier {
  unsigned expected = 0, pending = 0;
  uint64_t phase = 0, magic = 0;
  std::vector<EmuAsyncCopy> landing;
  char sync[2] = {};  // TSan's sync objects by phase parity: arrivals release, the waits that pass acquire
};
// A named barrier (bar.sync / bar.arrive with an id 1..15 and a thread count).
struct EmuNamedBarrier {
  unsigned expected = 0, arrived = 0;
  uint64_t gen = 0;
  char sync[2] = {};
};
struct EmuBlock {
  std::vector<std::unique_ptr<unsigned char[]>> bufs;
  std::vector<size_t> sizes;
  std::map<unsigned, EmuAsyncCopies> async_copies;  // by the thread's linear index in the block
  std::map<unsigned, EmuWgmmaState> wgmma;          // likewise
  std::map<const void*, EmuMbarrier> mbarriers;      // by their shared-memory address
  EmuNamedBarrier named[16];                         // by id (0, __syncthreads', unused)
  size_t dynamic_bytes = 0;                          // the dynamic shared memory (at emu_smem)
  // The dynamic shared memory as the async proxy (wgmma) sees it: a copy taken at block start and at each
  // fence_proxy_async (emu_ptx.h).
  std::vector<unsigned char> async_view;
  // What the launch may use, as a GPU counts it: the dynamic bytes asked for, and the static ones allocated so far;
  // without cudaFuncSetAttribute's opt-in (dynamic_optin 0) both within 48 KB, with it the opted-in dynamic size
  // and the static bytes within the device's shared memory per block (emu_shared_alloc checks).
  size_t dynamic_asked = 0, dynamic_optin = 0, static_bytes = 0;
};
// Whether [p, p + bytes) lies in the calling thread's block's shared memory (dynamic, or a static buffer).
inline bool emu_in_shared(const void* p, size_t bytes);
inline thread_local EmuBarrier* emu_block_bar;
inline thread_local EmuWarp* emu_warp;
inline thread_local EmuBlock* emu_block;
inline thread_local unsigned emu_static_idx;
inline thread_local uint64_t emu_shfl_gen;
inline thread_local unsigned emu_lane;
// What a CUDA thread keeps in the OS thread's thread_locals: set at its start, saved and restored around a wait.
struct EmuThreadRegs {
  emu_uint3 thread_idx, block_idx;
  dim3 block_dim, grid_dim;
  float* smem;
  EmuBarrier* block_bar;
  EmuWarp* warp;
  EmuBlock* block;
  unsigned static_idx, lane;
  uint64_t shfl_gen;
  static EmuThreadRegs save() {
    return {threadIdx, blockIdx, blockDim, gridDim, emu_smem, emu_block_bar, emu_warp, emu_block, emu_static_idx,
            emu_lane, emu_shfl_gen};
  }
  void restore() const {  // REQUIRES: TSan ignoring (every fiber of the OS thread writes them)
    threadIdx = thread_idx, blockIdx = block_idx, blockDim = block_dim, gridDim = grid_dim, emu_smem = smem;
    emu_block_bar = block_bar, emu_warp = warp, emu_block = block, emu_static_idx = static_idx, emu_lane = lane;
    emu_shfl_gen = shfl_gen;
  }
};
inline void EmuBarrier::arrive_and_wait() {
  const uint64_t gen = phase();
  emu_tsan_release(&sync_[gen & 1]);
  {
    EmuTsanIgnore ignore;
    if (++arrived_ == expected_) {
      complete();
    } else {
      const EmuThreadRegs regs = EmuThreadRegs::save();
      emu_fiber_wait(&gen_, gen);
      regs.restore();
    }
  }
  emu_tsan_acquire(&sync_[gen & 1]);
}
inline void EmuBarrier::arrive_and_drop() {
  emu_tsan_release(&sync_[phase() & 1]);
  EmuTsanIgnore ignore;
  --expected_;
  if (arrived_ > 0 && arrived_ == expected_) complete();
}
// The calling lane's next warp-collective call number (all lanes of a warp must be at the same one).
inline uint64_t emu_next_warp_call() {
  EmuTsanIgnore ignore;
  return ++emu_shfl_gen;
}
inline void __syncthreads() { emu_block_bar->arrive_and_wait(); }
inline bool emu_in_shared(const void* p, size_t bytes) {
  EmuTsanIgnore ignore;
  const auto* c = static_cast<const unsigned char*>(p);
  const auto* dyn = reinterpret_cast<const unsigned char*>(emu_smem);
  if (c >= dyn && c + bytes <= dyn + emu_block->dynamic_bytes) return true;
  for (size_t k = 0; k < emu_block->bufs.size(); ++k) {
    const unsigned char* b = emu_block->bufs[k].get();
    if (c >= b && c + bytes <= b + emu_block->sizes[k]) return true;
  }
  return false;
}
// Static __shared__ arrays: the k-th declaration a thread executes is the block's k-th buffer.
inline size_t& emu_smem_per_block();
inline void* emu_shared_alloc(size_t bytes) {  // a block's threads are fibers of one OS thread: no lock
  EmuTsanIgnore ignore;  // bookkeeping and the NaN fill: only the kernel's own accesses are TSan's business
  const unsigned k = emu_static_idx++;
  if (emu_block->bufs.size() <= k) {
    emu_block->static_bytes += bytes;
    if (emu_block->dynamic_optin == 0 && emu_block->dynamic_asked + emu_block->static_bytes > 48 * 1024) {
      std::fprintf(stderr, "EMU: %zu bytes of static and %zu of dynamic shared memory: over the 48 KB a block gets "
                   "without cudaFuncSetAttribute's MaxDynamicSharedMemorySize\n", emu_block->static_bytes,
                   emu_block->dynamic_asked);
      std::abort();
    }
    if (emu_block->dynamic_optin != 0 && emu_block->dynamic_optin + emu_block->static_bytes > emu_smem_per_block()) {
      std::fprintf(stderr, "EMU: %zu bytes of static shared memory beside the %zu dynamic opted in: over the device's "
                   "%zu per block\n", emu_block->static_bytes, emu_block->dynamic_optin, emu_smem_per_block());
      std::abort();
    }
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
  const uint64_t g = emu_next_warp_call();
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
  const uint64_t g = emu_next_warp_call();
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
// At a block's end: no wgmma may still be in flight (each product retired by a wgmma.wait_group before its thread
// exited), and the threads of each warpgroup (128 consecutive linear indices, of the block's nthr) in which any
// thread issued one issued the same wgmma instructions (EmuWgmmaState::trace), a thread that issued none counted as
// an empty sequence (a warp that returned before them fails too).
inline const char* emu_wgmma_op_name(int kind) {
  return kind == 0 ? "mma_async" : kind == 1 ? "commit_group" : kind == 2 ? "wait_group" : "setmaxnreg";
}
inline void emu_wgmma_check_block(const EmuBlock& blk, unsigned nthr) {
  static const std::vector<EmuWgmmaOp> none;
  auto trace_of = [&](unsigned tid) -> const std::vector<EmuWgmmaOp>& {
    const auto it = blk.wgmma.find(tid);
    return it == blk.wgmma.end() ? none : it->second.trace;
  };
  for (const auto& [tid, st] : blk.wgmma) {
    if (!st.open.empty() || !st.groups.empty()) {
      std::fprintf(stderr,
                   "EMU: thread %u exited with wgmma products not retired by a wgmma.wait_group (%zu uncommitted, %zu "
                   "groups in flight)\n",
                   tid, st.open.size(), st.groups.size());
      std::abort();
    }
  }
  for (auto it = blk.wgmma.begin(); it != blk.wgmma.end();) {
    const unsigned lead = it->first / 128 * 128;  // a warpgroup with a thread that issued any: all its threads
    for (unsigned tid = lead; tid < std::min(lead + 128, nthr); ++tid) {
      const std::vector<EmuWgmmaOp>& mine = trace_of(tid);
      const std::vector<EmuWgmmaOp>& theirs = trace_of(lead);
      if (mine == theirs) continue;
      size_t i = 0;
      while (i < mine.size() && i < theirs.size() && mine[i] == theirs[i]) ++i;
      auto say = [](const std::vector<EmuWgmmaOp>& t, size_t i) {
        if (i >= t.size()) return std::string("nothing more");
        const EmuWgmmaOp& o = t[i];
        char buf[160];
        std::snprintf(buf, sizeof buf, "%s n %d flags %d desc_a %#llx desc_b %#llx", emu_wgmma_op_name(o.kind), o.n,
                      o.flags, static_cast<unsigned long long>(o.desc_a), static_cast<unsigned long long>(o.desc_b));
        return std::string(buf);
      };
      std::fprintf(stderr,
                   "EMU: warpgroup %u's threads issued different wgmma instructions: at its instruction %zu thread %u "
                   "issued %s, thread %u %s (a warpgroup instruction: all 128 threads, the same operands)\n",
                   tid / 128, i, lead, say(theirs, i).c_str(), tid, say(mine, i).c_str());
      std::abort();
    }
    it = blk.wgmma.lower_bound(lead + 128);  // the next warpgroup with any
  }
}
// At a block's end: no mbarrier phase left incomplete with cp.async copies it tracks (a producer whose copies no
// consumer could ever see: some of the arrivals the phase needs never came).
inline void emu_mbarrier_check_block(const EmuBlock& blk) {
  for (const auto& [addr, mb] : blk.mbarriers) {
    if (!mb.landing.empty()) {
      std::fprintf(stderr,
                   "EMU: block ended with an mbarrier phase incomplete (%u of %u arrivals missing) and %zu cp.async "
                   "copies tracked by it\n",
                   mb.pending, mb.expected, mb.landing.size());
      std::abort();
    }
  }
}
// First in the body of a kernel compiled with __launch_bounds__(max_threads[, ...]) (convert.py puts it there): a
// GPU refuses a launch of more threads per block than that ("too many resources requested for launch").
inline void emu_check_launch_bounds(unsigned max_threads) {
  const unsigned n = blockDim.x * blockDim.y * blockDim.z;
  if (n > max_threads) {
    std::fprintf(stderr, "EMU: launch of %u threads per block, over the kernel's __launch_bounds__ of %u\n", n, max_threads);
    std::abort();
  }
}
// reinterpret_cast<V*>(q) for a CUDA vector type V (float4, uint2, ...: convert.py rewrites those casts): a GPU
// faults on a vector access not aligned to V's size ("misaligned address"), so this aborts on such a pointer.
template <class P, class Q>
P emu_vector_cast(Q* q) {
  using V = std::remove_cv_t<std::remove_pointer_t<P>>;
  if (reinterpret_cast<uintptr_t>(q) % alignof(V) != 0) {
    std::fprintf(stderr, "EMU: misaligned vector access (%zu bytes at %p)\n", sizeof(V),
                 static_cast<const volatile void*>(q));
    std::abort();
  }
  return reinterpret_cast<P>(q);
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
#include "emu_runtime_api.h"  // the runtime API's host side: errors, memory, streams, events, copies, devices
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
enum cudaSharedCarveout { cudaSharedmemCarveoutDefault = -1, cudaSharedmemCarveoutMaxShared = 100 };
// Per kernel: the dynamic shared memory it was opted into (a launch past 48 KB without it fails on a GPU).
inline std::map<const void*, size_t>& emu_smem_optin() {
  static std::map<const void*, size_t> m;
  return m;
}
template <class... P>
int cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int bytes) {
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) {  // a hint (percent of the unified cache): no effect here
    if (bytes < -1 || bytes > 100) emu_fail("cudaFuncSetAttribute: a shared memory carveout outside -1..100");
    return 0;
  }
  if (bytes < 0 || static_cast<size_t>(bytes) > emu_smem_per_block()) {
    emu_fail("cudaFuncSetAttribute: more dynamic shared memory than the device allows a block");
  }
  emu_smem_optin()[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(bytes);
  return 0;
}
inline long emu_launches = 0, emu_threads_total = 0;

// The OS threads that run blocks side by side under EMU_CONC, kept between launches. run(n, fn) calls
// fn(0..n-1) on n distinct threads at once and returns when all have returned. Called from one thread at a
// time (kernels run one at a time).
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

// Kernels run one at a time (the thread pool is one), whichever thread runs their stream.
inline std::mutex& emu_kernel_mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
template <class... P, class... A>
void emu_run_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A... args);

// A launch checks its configuration at once and runs when its stream gets to it (at once on the legacy stream).
template <class... P, class... A>
void emulate_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A... args) {
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
  emu_enqueue(stream, [=] {
    std::lock_guard<std::mutex> g(emu_kernel_mu());
    emu_run_kernel(kernel, grid, block, smem, args...);
  });
}

template <class... P, class... A>
void emu_run_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, A... args) {
  const unsigned nthr = block.x * block.y * block.z;
  const char* ce = std::getenv("EMU_CONC");
  unsigned conc = ce ? std::atoi(ce) : 1;  // blocks run concurrently
  if (conc < 1) conc = 1;
  struct BlockState {
    struct FreeDel { void operator()(float* p) const { std::free(p); } };
    std::unique_ptr<float[], FreeDel> sm;
    std::unique_ptr<EmuBarrier> bar;
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
      st->blk.dynamic_bytes = smem_alloc;
      st->blk.async_view.assign(reinterpret_cast<const unsigned char*>(st->sm.get()),
                                reinterpret_cast<const unsigned char*>(st->sm.get()) + smem_alloc);
      st->blk.dynamic_asked = smem;
      {
        const auto it = emu_smem_optin().find(reinterpret_cast<const void*>(kernel));
        st->blk.dynamic_optin = it == emu_smem_optin().end() ? 0 : it->second;
      }
      st->bar = std::make_unique<EmuBarrier>(nthr);
      for (unsigned w = 0; w < (nthr + 31) / 32; ++w) st->warps.push_back(std::make_unique<EmuWarp>(std::min(32u, nthr - w * 32)));
      states.push_back(std::move(st));
    }
    auto one = [&](uint64_t b, unsigned t) {  // CUDA thread t of block b, on a fiber
      BlockState* st = states[b - b0].get();
      const unsigned bx = b % grid.x, by = (b / grid.x) % grid.y, bz = b / ((uint64_t)grid.x * grid.y);
      {
        EmuTsanIgnore ignore;
        EmuThreadRegs{{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)}, {bx, by, bz}, block, grid,
                      st->sm.get(), st->bar.get(), st->warps[t / 32].get(), &st->blk, 0, t % 32, 0}
            .restore();
      }
      kernel(static_cast<P>(args)...);
      emu_warp->bar.arrive_and_drop();
      emu_block_bar->arrive_and_drop();
    };
    struct BlockTask {
      decltype(one)* fn;
      uint64_t b;
    };
    auto run_block = [&](uint64_t b) {  // all of block b's threads, as fibers of the calling OS thread
      BlockTask task{&one, b};
      // Odd blocks run their threads last to first: a hazard shows from both sides, reproducibly per block.
      emu_fiber_run(nthr, (b & 1) != 0, [](void* p, unsigned t) { auto* bt = static_cast<BlockTask*>(p); (*bt->fn)(bt->b, t); }, &task);
    };
    if (b1 - b0 == 1) {
      run_block(b0);
    } else {
      auto on_pool_thread = [&](unsigned j) { run_block(b0 + j); };
      EmuThreadPool::instance().run(static_cast<unsigned>(b1 - b0), on_pool_thread);
    }
    for (const auto& st : states) {
      emu_wgmma_check_block(st->blk, nthr);
      emu_mbarrier_check_block(st->blk);
    }
    const unsigned total = static_cast<unsigned>((b1 - b0) * nthr);
    emu_threads_total += total;
  }
}
