// Part of the emulator's cuda_runtime.h, included there (not on its own): the CUDA runtime API's host side. Error
// codes, device and pinned allocations (recorded, so the NCCL shim and the copies can check what they are given),
// streams (a created one defers its work, in order, until something needs it), events, copies and memsets, and the
// device's count and attributes (the shared memory per block, compute capability and L2 size that tests may set).
#pragma once

typedef int cudaError_t;
constexpr int cudaSuccess = 0;
typedef struct CUstream_st* cudaStream_t;
constexpr int cudaErrorMemoryAllocation = 2;
constexpr int cudaErrorCudartUnloading = 4;
constexpr int cudaErrorInvalidResourceHandle = 400;
constexpr int cudaErrorNotReady = 600;
inline const char* cudaGetErrorString(int e) {
  switch (e) {
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
  }
  return "emu";
}
inline int cudaGetLastError() { return 0; }
constexpr unsigned cudaStreamNonBlocking = 1;
constexpr unsigned cudaEventDisableTiming = 2;

// Device memory is host memory here, but cudaMalloc and cudaMallocHost record each allocation, so the NCCL shim
// can check that it is given device buffers (emu_is_device), and copies know pinned host memory from pageable (a
// copy into pageable memory waits for the stream).
struct EmuAllocs {
  std::mutex mu;
  std::map<uintptr_t, size_t> device, pinned;  // start -> bytes
};
inline EmuAllocs& emu_allocs() {
  static EmuAllocs* a = new EmuAllocs;  // never destroyed: frees may come from static destructors
  return *a;
}
inline bool emu_in(const std::map<uintptr_t, size_t>& m, const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(at);
  if (it == m.begin()) return false;
  --it;
  return at + bytes <= it->first + it->second;
}
inline bool emu_is_device(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(emu_allocs().mu);
  return emu_in(emu_allocs().device, p, bytes);
}
inline bool emu_is_pinned(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> g(emu_allocs().mu);
  return emu_in(emu_allocs().pinned, p, bytes);
}

// Streams. The legacy default stream (nullptr: the kernel unit tests) runs every launch and copy at once. A
// created stream defers them, in order, until something needs them: a synchronisation (cudaStreamSynchronize,
// cudaEventSynchronize, cudaEventQuery, a device-to-pageable copy on it, cudaFree, cudaStreamDestroy), or
// another stream that waits on one of its events (cudaStreamWaitEvent) getting to that wait. So a result read
// without the synchronisation a GPU needs is stale here too, and a stream that does not wait for the work it
// depends on runs before it. Whichever thread needs a stream runs its pending work (one thread per stream at a
// time; kernels one at a time over the thread pool).
struct EmuStream {
  std::mutex mu;  // guards all of it
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;  // queued, not yet started
  uint64_t enqueued = 0, done = 0;         // ops queued and finished so far
  bool running = false;                    // a thread is running ops[done] (outside the lock)
  int64_t collective = -1;  // the latest NCCL collective (by launch) its queued work is ordered after; -1: none
  bool early = false;       // emu_stream_run_early
};
struct EmuStreams {
  std::mutex mu;
  std::vector<EmuStream*> all;
  std::vector<EmuStream*> destroyed;  // kept for the events recorded on them (cudaStreamDestroy)
};
inline EmuStreams& emu_streams() {
  static EmuStreams* s = new EmuStreams;
  return *s;
}
// Runs `s` until `pos` of its ops have finished, or waits for the thread already running it to get there. No
// lock is held while an op runs, so an op that waits for another stream (which may itself be waiting for an
// earlier op of this one) cannot deadlock: dependencies point only to ops queued before.
inline void emu_run_until(EmuStream* s, uint64_t pos) {
  if (s == nullptr) return;
  std::unique_lock<std::mutex> g(s->mu);
  while (s->done < pos) {
    if (s->running) {
      s->cv.wait(g);
      continue;
    }
    s->running = true;
    std::function<void()> op = std::move(s->ops.front());
    s->ops.pop_front();
    g.unlock();
    op();
    g.lock();
    ++s->done;
    s->running = false;
    s->cv.notify_all();
  }
}
inline void emu_drain(EmuStream* s) {
  if (s == nullptr) return;
  uint64_t pos = 0;
  {
    std::lock_guard<std::mutex> g(s->mu);
    pos = s->enqueued;
  }
  emu_run_until(s, pos);
}
inline void emu_drain_all() {  // cudaFree, cudaDeviceSynchronize
  std::vector<EmuStream*> all;
  {
    std::lock_guard<std::mutex> g(emu_streams().mu);
    all = emu_streams().all;
  }
  for (EmuStream* s : all) emu_drain(s);
}
inline void emu_enqueue(cudaStream_t stream, std::function<void()> op) {
  auto* s = reinterpret_cast<EmuStream*>(stream);
  if (s == nullptr) {
    op();
    return;
  }
  bool early = false;
  {
    std::lock_guard<std::mutex> g(s->mu);
    s->ops.push_back(std::move(op));
    ++s->enqueued;
    early = s->early;
  }
  if (early) emu_drain(s);
}
// For a stream the CUDA backend forks work onto (GPT_GEMM_WGRAD_STREAM's): its work runs as soon as it is queued,
// after what it waits for, while the stream it forked from stays deferred. So work that does not wait for the inputs
// another stream has still to write reads them unwritten, as on a GPU it may (the deferred streams expose the other
// half: work that does not wait for the results it reads). EMU_RUN_EARLY=0 leaves it deferred like the others.
inline void emu_stream_run_early(cudaStream_t stream) {
  const char* v = std::getenv("EMU_RUN_EARLY");
  auto* s = reinterpret_cast<EmuStream*>(stream);
  std::lock_guard<std::mutex> g(s->mu);
  s->early = v == nullptr || std::strcmp(v, "0") != 0;
}
inline int cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  auto* st = new EmuStream;
  std::lock_guard<std::mutex> g(emu_streams().mu);
  emu_streams().all.push_back(st);
  *s = reinterpret_cast<cudaStream_t>(st);
  return 0;
}
inline int cudaStreamSynchronize(cudaStream_t s) {
  emu_drain(reinterpret_cast<EmuStream*>(s));
  return 0;
}
// The stream itself is kept (drained, so nothing runs on it again): an event recorded on it stays valid for
// waits and queries, as on a GPU.
inline int cudaStreamDestroy(cudaStream_t stream) {
  auto* s = reinterpret_cast<EmuStream*>(stream);
  emu_drain(s);  // CUDA finishes a destroyed stream's work
  std::lock_guard<std::mutex> g(emu_streams().mu);
  auto& all = emu_streams().all;
  all.erase(std::find(all.begin(), all.end(), s));
  emu_streams().destroyed.push_back(s);
  return 0;
}
inline int cudaDeviceSynchronize() {
  emu_drain_all();
  return 0;
}
// An event is a point in one stream: its first `pos` ops.
struct EmuEvent {
  EmuStream* stream = nullptr;
  uint64_t pos = 0;
  int64_t collective = -1;  // its stream's EmuStream::collective when recorded
  bool timing = true;       // not created with cudaEventDisableTiming
  bool recorded = false;
};
typedef struct CUevent_st* cudaEvent_t;
inline EmuEvent* emu_event(cudaEvent_t e) { return reinterpret_cast<EmuEvent*>(e); }
inline int cudaEventCreate(cudaEvent_t* e) {
  *e = reinterpret_cast<cudaEvent_t>(new EmuEvent);
  return 0;
}
inline int cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  cudaEventCreate(e);
  emu_event(*e)->timing = (flags & cudaEventDisableTiming) == 0;
  return 0;
}
inline int cudaEventDestroy(cudaEvent_t e) {
  delete emu_event(e);
  return 0;
}
inline int cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  auto* s = reinterpret_cast<EmuStream*>(stream);
  uint64_t pos = 0;
  int64_t collective = -1;
  if (s != nullptr) {
    std::lock_guard<std::mutex> g(s->mu);
    pos = s->enqueued;
    collective = s->collective;
  }
  EmuEvent* ev = emu_event(e);
  ev->stream = s;
  ev->pos = pos;
  ev->collective = collective;
  ev->recorded = true;
  return 0;
}
inline int cudaEventSynchronize(cudaEvent_t e) {
  const EmuEvent ev = *emu_event(e);
  emu_run_until(ev.stream, ev.pos);
  return 0;
}
inline int cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }  // done once asked
// As CUDA: both events recorded, with timing, and complete (else cudaErrorNotReady); the time is 0 here.
inline int cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  for (const EmuEvent* ev : {emu_event(a), emu_event(b)}) {
    if (!ev->timing || !ev->recorded) return cudaErrorInvalidResourceHandle;
    if (ev->stream != nullptr) {
      std::lock_guard<std::mutex> g(ev->stream->mu);
      if (ev->stream->done < ev->pos) return cudaErrorNotReady;
    }
  }
  *ms = 0.0f;
  return 0;
}
// The waiting stream, when it gets there, first runs the event's stream up to the event (as recorded now).
inline int cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned) {
  const EmuEvent ev = *emu_event(e);
  emu_enqueue(stream, [ev] { emu_run_until(ev.stream, ev.pos); });
  if (auto* s = reinterpret_cast<EmuStream*>(stream); s != nullptr) {
    std::lock_guard<std::mutex> g(s->mu);
    s->collective = std::max(s->collective, ev.collective);
  }
  return 0;
}
// For the NCCL shim: NCCL collective number `seq` (this process's launches, counted from 0) goes on `stream`.
// Returns the latest collective the stream's work was ordered after until now (-1: none), by the stream itself or
// by its event waits, transitively; the stream is then ordered after `seq`.
inline int64_t emu_order_collective(cudaStream_t stream, int64_t seq) {
  auto* s = reinterpret_cast<EmuStream*>(stream);
  if (s == nullptr) return seq - 1;  // the legacy stream runs everything at once, in launch order
  std::lock_guard<std::mutex> g(s->mu);
  const int64_t before = s->collective;
  s->collective = seq;
  return before;
}

enum cudaMemcpyKind { cudaMemcpyDeviceToDevice, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost };
// As CUDA promises at the least: to pageable host memory the call waits for the stream and copies; every other
// copy reads and writes when the stream runs it, from pageable host memory too. A GPU driver usually stages a
// pageable source before the call returns, but CUDA documents only that such a copy "might be synchronous", and
// where the GPU reads pageable memory itself (ATS, HMM) it can read it later: a caller that reuses the source
// before the stream has run the copy sends what it wrote instead.
inline int cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  if (n == 0) return 0;
  if (kind == cudaMemcpyDeviceToHost && !emu_is_pinned(d, n)) {
    emu_drain(reinterpret_cast<EmuStream*>(stream));
    std::memmove(d, s, n);
  } else {
    emu_enqueue(stream, [d, s, n] { std::memmove(d, s, n); });
  }
  return 0;
}
// The legacy stream, synchronous (it does not wait for created streams: they are all non-blocking).
inline int cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  std::memmove(d, s, n);
  return 0;
}
inline int cudaMemsetAsync(void* d, int v, size_t n, cudaStream_t stream) {
  emu_enqueue(stream, [d, v, n] { std::memset(d, v, n); });
  return 0;
}
// The emulated device: emu_device_bytes (80 GiB unless a test sets less) of which this process's cudaMalloc'd
// bytes (rounded up as they are allocated) are in use, plus kEmuContextBytes standing for the CUDA context (the
// driver's count includes it on a GPU). A cudaMalloc beyond it fails as on a GPU, with cudaErrorMemoryAllocation.
inline size_t emu_device_bytes = size_t{80} << 30;
constexpr size_t kEmuContextBytes = size_t{300} << 20;
inline size_t emu_rounded(size_t n) { return n == 0 ? 256 : (n + 255) / 256 * 256; }
inline size_t emu_device_used_locked() {
  size_t used = kEmuContextBytes;
  for (const auto& [p, n] : emu_allocs().device) used += emu_rounded(n);
  return used;
}
inline int cudaMalloc(void** p, size_t n) {
  std::lock_guard<std::mutex> g(emu_allocs().mu);
  if (emu_device_used_locked() + emu_rounded(n) > emu_device_bytes) {
    *p = nullptr;
    return cudaErrorMemoryAllocation;
  }
  *p = std::aligned_alloc(256, emu_rounded(n));
  emu_allocs().device[reinterpret_cast<uintptr_t>(*p)] = n;
  return 0;
}
template <class T>
int cudaMalloc(T** p, size_t n) {  // the runtime's typed overload
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}
inline int cudaMemGetInfo(size_t* free, size_t* total) {
  std::lock_guard<std::mutex> g(emu_allocs().mu);
  const size_t used = emu_device_used_locked();
  *total = emu_device_bytes;
  *free = used < emu_device_bytes ? emu_device_bytes - used : 0;
  return 0;
}
inline void emu_free(std::map<uintptr_t, size_t>& m, void* p, const char* what) {
  if (p == nullptr) return;
  emu_drain_all();  // CUDA's frees wait for the device
  {
    std::lock_guard<std::mutex> g(emu_allocs().mu);
    if (m.erase(reinterpret_cast<uintptr_t>(p)) != 1) emu_fail(what);
  }
  std::free(p);
}
inline int cudaFree(void* p) {
  emu_free(emu_allocs().device, p, "cudaFree of a pointer cudaMalloc did not return");
  return 0;
}
template <class T>
int cudaMallocHost(T** p, size_t n) {  // pinned host memory: not device memory
  *p = static_cast<T*>(std::aligned_alloc(256, n == 0 ? 256 : (n + 255) / 256 * 256));
  std::lock_guard<std::mutex> g(emu_allocs().mu);
  emu_allocs().pinned[reinterpret_cast<uintptr_t>(*p)] = n;
  return 0;
}
inline int cudaFreeHost(void* p) {
  emu_free(emu_allocs().pinned, p, "cudaFreeHost of a pointer cudaMallocHost did not return");
  return 0;
}
// One emulated device, or EMU_DEVICES of them (the NCCL tests run several ranks on one node, one "GPU" each).
inline int emu_device_count() {
  const char* n = std::getenv("EMU_DEVICES");
  return n != nullptr && std::atoi(n) > 0 ? std::atoi(n) : 1;
}
inline int& emu_current_device() {  // per host thread, as the CUDA runtime's current device
  static thread_local int device = 0;
  return device;
}
inline int cudaSetDevice(int device) {
  if (device < 0 || device >= emu_device_count()) return 1;
  emu_current_device() = device;
  return 0;
}
inline int cudaGetDevice(int* device) { *device = emu_current_device(); return 0; }
inline int cudaGetDeviceCount(int* n) { *n = emu_device_count(); return 0; }
// Emulated device d is the same GPU in every process on this host, as device d is on a node.
inline int cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (device < 0 || device >= emu_device_count()) return 1;
  std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", 0x10 + device);
  return 0;
}
struct cudaDeviceProp { char name[256] = "CUDA emulator"; };
inline int cudaGetDeviceProperties(cudaDeviceProp* p, int) { *p = cudaDeviceProp{}; return 0; }
// The most dynamic shared memory a block may opt into: an H100's 227 KB unless a test makes the emulated GPU
// smaller (an sm_86/sm_89 part allows 99 KB).
inline size_t& emu_smem_per_block() {
  static size_t bytes = 227 * 1024;
  return bytes;
}
// The emulated GPU's compute capability (major, minor): an H100's 9.0 unless a test makes it older.
inline std::pair<int, int>& emu_compute_capability() {
  static std::pair<int, int> cc{9, 0};
  return cc;
}
// The emulated GPU's L2 cache: an H100's 50 MB unless a test makes it smaller (the attention's tile sections).
inline int& emu_l2_bytes() {
  static int bytes = 50 * 1024 * 1024;
  return bytes;
}
enum cudaDeviceAttr {
  cudaDevAttrL2CacheSize = 38,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
inline int cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrL2CacheSize:
      *value = emu_l2_bytes();
      return 0;
    case cudaDevAttrComputeCapabilityMajor:
      *value = emu_compute_capability().first;
      return 0;
    case cudaDevAttrComputeCapabilityMinor:
      *value = emu_compute_capability().second;
      return 0;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(emu_smem_per_block());
      return 0;
  }
  return 1;  // cudaErrorInvalidValue
}
