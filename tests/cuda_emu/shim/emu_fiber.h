// The emulator's CUDA threads: the threads of one block are fibers on the OS thread that runs the block
// (fiber.cc). They switch only where a thread waits at a barrier (__syncthreads, warp collectives), so a block
// costs no OS thread wakeups; a switch is a few instructions on x86-64 (ucontext elsewhere). Fibers are kept
// between launches, one set per OS thread that runs blocks, and never move between OS threads, so
// thread_local state stays valid; what a CUDA thread keeps in thread_locals (threadIdx, ...) is saved and
// restored around every wait by cuda_runtime.h's EmuBarrier, the only place that waits. Under ASan and TSan
// the switches are announced to the sanitizer; TSan sees each fiber as a thread, ordered only by the block's
// barriers (and by the launch's start and end), so it still finds races inside a block.
#pragma once
#include <cstdint>

// Runs task(arg, 0..n-1), each on its own fiber of the calling OS thread, until all have returned. The
// scheduler always resumes the first fiber, in its order, that can run (has not returned, is not waiting), so
// one warp runs ahead of the others up to the block's next __syncthreads, and one lane ahead of its warp up to
// the next warp collective: a missing barrier lets it read what others have not written yet (NaN), or
// overwrite what they have not read. The order is first to last, or last to first if `reverse` (the launch
// alternates it from block to block, so both directions of every such hazard are tried). Aborts when fibers
// are left and none can run (a barrier in divergent code: a deadlock on a GPU). Not reentrant: a task must
// not call it.
void emu_fiber_run(unsigned n, bool reverse, void (*task)(void* arg, unsigned i), void* arg);
// Inside a task: suspends the calling fiber until *gen != seen (the other fibers run meanwhile).
void emu_fiber_wait(const uint64_t* gen, uint64_t seen);
// Inside a task: lets the scheduler run the first fiber, in its order, that can run (this one, if it comes first):
// after an arrival that does not wait (mbarrier, bar.arrive), so that a fiber earlier in the order, released by it,
// runs before the arriving one goes on.
void emu_fiber_yield();
// Inside a task: a barrier completed, so fibers waiting on it can run (the scheduler looks again from its first).
void emu_fiber_woke();
// TSan's view of the block's barriers (no-ops without TSan): release before waiting, acquire after.
void emu_tsan_release(const void* addr);
void emu_tsan_acquire(const void* addr);

// Hides the emulator's own bookkeeping from TSan for its scope: the thread_locals that every fiber of an OS
// thread shares (threadIdx, ... written at each switch; the kernels only read them), barrier counters, the
// scheduler's state. All of it is ordered by the switches, which TSan is told nothing about (fibers look to it
// like threads, ordered only by the barriers' release and acquire). Nothing without TSan.
#if defined(__SANITIZE_THREAD__)
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
extern "C" void AnnotateIgnoreWritesBegin(const char* file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char* file, int line);
struct EmuTsanIgnore {
  EmuTsanIgnore() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~EmuTsanIgnore() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
  EmuTsanIgnore(const EmuTsanIgnore&) = delete;
  EmuTsanIgnore& operator=(const EmuTsanIgnore&) = delete;
};
#else
struct EmuTsanIgnore {
  EmuTsanIgnore() {}  // user-provided: no unused-variable warning
};
#endif
