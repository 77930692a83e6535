// Fibers for the emulator's CUDA threads (shim/emu_fiber.h). Each OS thread that runs blocks has a scheduler
// with a pool of fibers, grown to the largest block it has run and kept (like the worker threads they
// replace). A fiber's stack is an mmap with a guard page below it, so an overflow faults instead of
// corrupting a neighbour. A fiber never exits: it loops, running one task per launch.
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "emu_fiber.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__SANITIZE_THREAD__)
#define EMU_TSAN 1
#include <sanitizer/tsan_interface.h>
#endif

#if defined(__x86_64__)
// emu_ctx_switch(&save, next): pushes the callee-saved registers, stores the stack pointer in *save, switches to
// next's stack and pops its registers (System V ABI: everything else is caller-saved; the FP control words are
// never changed by the kernels). A new fiber's stack is laid out so that the first switch "returns" into
// emu_ctx_start with r12 = argument and r13 = entry function, and rsp 16-byte aligned before the call.
asm(R"(
  .text
  .p2align 4
  .globl emu_ctx_switch
  .hidden emu_ctx_switch
  .type emu_ctx_switch, @function
emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_ctx_switch, .-emu_ctx_switch

  .p2align 4
  .globl emu_ctx_start
  .hidden emu_ctx_start
  .type emu_ctx_start, @function
emu_ctx_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size emu_ctx_start, .-emu_ctx_start
)");
extern "C" void emu_ctx_switch(void** save, void* next);
extern "C" void emu_ctx_start();
#endif

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "EMU: %s\n", what);
  std::abort();
}

#if defined(EMU_ASAN)
constexpr size_t kStackBytes = 1024 * 1024;  // ASan's redzones make frames several times larger
#else
constexpr size_t kStackBytes = 256 * 1024;
#endif

struct Scheduler;

// A suspended execution context: where a switch resumes it.
struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// Saves the running context into `from` and resumes `to`; returns when something switches back to `from`.
void swap_context(Context& from, Context& to) {
#if defined(__x86_64__)
  emu_ctx_switch(&from.sp, to.sp);
#else
  if (swapcontext(&from.uc, &to.uc) != 0) fail("swapcontext");
#endif
}

struct Fiber {
  Scheduler* sched = nullptr;
  unsigned idx = 0;
  bool done = true;
  const uint64_t* wait = nullptr;  // waiting until *wait != seen
  uint64_t seen = 0;
  unsigned char* stack = nullptr;  // kStackBytes, above one guard page
  Context ctx;
  void* asan_fake = nullptr;
  void* tsan = nullptr;
};

struct Scheduler {
  std::vector<std::unique_ptr<Fiber>> fibers;
  Fiber* current = nullptr;
  void (*task)(void*, unsigned) = nullptr;
  void* arg = nullptr;
  bool woke = false;                  // a barrier completed during the last resume
  char tsan_start = 0, tsan_end = 0;  // a launch's start happens before its threads, its threads before its end
  Context ctx;
  void* tsan = nullptr;
  const void* asan_bottom = nullptr;  // the scheduler's stack, as ASan reports it to the fibers
  size_t asan_size = 0;
};

thread_local Scheduler* t_sched = nullptr;

void fiber_main(Fiber* f);

#if !defined(__x86_64__)
void fiber_main_uc(unsigned hi, unsigned lo) {
  fiber_main(reinterpret_cast<Fiber*>((static_cast<uintptr_t>(hi) << 32) | lo));
}
#endif

void init_fiber(Fiber* f) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* m =
      mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) fail("cannot map a fiber stack");
  if (mprotect(m, page, PROT_NONE) != 0) fail("cannot protect a fiber stack's guard page");
  f->stack = static_cast<unsigned char*>(m) + page;
#if defined(__x86_64__)
  auto top = reinterpret_cast<uintptr_t>(f->stack + kStackBytes) & ~uintptr_t{15};
  auto** sp = reinterpret_cast<void**>(top);
  *--sp = reinterpret_cast<void*>(&emu_ctx_start);  // "returned" to by the first switch
  *--sp = nullptr;                                  // rbp
  *--sp = nullptr;                                  // rbx
  *--sp = f;                                        // r12: the argument
  *--sp = reinterpret_cast<void*>(&fiber_main);     // r13: the entry
  *--sp = nullptr;                                  // r14
  *--sp = nullptr;                                  // r15
  f->ctx.sp = sp;
#else
  ucontext_t& uc = f->ctx.uc;
  if (getcontext(&uc) != 0) fail("getcontext");
  uc.uc_stack.ss_sp = f->stack;
  uc.uc_stack.ss_size = kStackBytes;
  uc.uc_link = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(f);
  makecontext(&uc, reinterpret_cast<void (*)()>(&fiber_main_uc), 2, static_cast<unsigned>(p >> 32),
              static_cast<unsigned>(p & 0xffffffffu));
#endif
#if defined(EMU_TSAN)
  f->tsan = __tsan_create_fiber(0);
#endif
}

// Scheduler -> fiber f, until f waits or finishes its task.
void resume(Scheduler* s, Fiber* f) {
  s->current = f;
#if defined(EMU_ASAN)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->stack, kStackBytes);
#endif
#if defined(EMU_TSAN)
  __tsan_switch_to_fiber(f->tsan, __tsan_switch_to_fiber_no_sync);  // ordered by barriers only
#endif
  swap_context(s->ctx, f->ctx);
#if defined(EMU_ASAN)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  s->current = nullptr;
}

// Fiber f -> its scheduler; returns when the scheduler resumes f.
void suspend(Fiber* f) {
  Scheduler* s = f->sched;
#if defined(EMU_ASAN)
  __sanitizer_start_switch_fiber(&f->asan_fake, s->asan_bottom, s->asan_size);
#endif
#if defined(EMU_TSAN)
  __tsan_switch_to_fiber(s->tsan, __tsan_switch_to_fiber_no_sync);
#endif
  swap_context(f->ctx, s->ctx);
#if defined(EMU_ASAN)
  __sanitizer_finish_switch_fiber(f->asan_fake, &s->asan_bottom, &s->asan_size);
#endif
}

void fiber_main(Fiber* f) {
#if defined(EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &f->sched->asan_bottom, &f->sched->asan_size);
#endif
  for (;;) {
    Scheduler* s = f->sched;
    emu_tsan_acquire(&s->tsan_start);
    s->task(s->arg, f->idx);
    emu_tsan_release(&s->tsan_end);
    EmuTsanIgnore ignore;  // the scheduler's state (ordered by the switch)
    f->done = true;
    suspend(f);
  }
}

// At thread exit (pthread key destructor: after the thread's C++ thread_local destructors, so no kernel runs
// on it afterwards). No fiber is inside a task then. Under TSan the fibers' TSan states are left alone: destroyed
// here, from a thread that is exiting (a stream thread of the engine's, instrumented in a GPT_SANITIZE=thread
// build), TSan stops the process with "thread finished with ignores enabled"; a few of them per thread are not
// worth a report.
void free_scheduler(void* p) {
  auto* s = static_cast<Scheduler*>(p);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (auto& f : s->fibers) {
    munmap(f->stack - page, kStackBytes + page);
  }
  delete s;
  t_sched = nullptr;
}

}  // namespace

void emu_fiber_run(unsigned n, bool reverse, void (*task)(void*, unsigned), void* arg) {
  if (t_sched == nullptr) {
    t_sched = new Scheduler();  // value-initialised (the ucontext_t too)
#if defined(EMU_TSAN)
    t_sched->tsan = __tsan_get_current_fiber();
#endif
    // Freed when the thread exits (stream threads that ran kernels come and go; the main thread's stays).
    static pthread_key_t key = [] {
      pthread_key_t k;
      if (pthread_key_create(&k, &free_scheduler) != 0) fail("pthread_key_create");
      return k;
    }();
    if (pthread_setspecific(key, t_sched) != 0) fail("pthread_setspecific");
  }
  Scheduler* s = t_sched;
  if (s->current != nullptr) fail("emu_fiber_run called from inside a fiber");
  while (s->fibers.size() < n) {
    auto f = std::make_unique<Fiber>();
    f->sched = s;
    f->idx = static_cast<unsigned>(s->fibers.size());
    init_fiber(f.get());
    s->fibers.push_back(std::move(f));
  }
  s->task = task;
  s->arg = arg;
  emu_tsan_release(&s->tsan_start);
  for (unsigned i = 0; i < n; ++i) {
    s->fibers[i]->done = false;
    s->fibers[i]->wait = nullptr;
  }
  unsigned live = n, cursor = 0;  // every fiber before the cursor has returned or waits
  while (live > 0) {
    Fiber* f = nullptr;
    for (; cursor < n; ++cursor) {
      Fiber* c = s->fibers[reverse ? n - 1 - cursor : cursor].get();
      if (!c->done && (c->wait == nullptr || *c->wait != c->seen)) {
        f = c;
        break;
      }
    }
    if (f == nullptr)
      fail(
          "deadlock: every thread of the block that has not returned waits at a barrier the others cannot reach "
          "(__syncthreads or a warp collective in divergent code, an mbarrier wait no arrival will end)");
    s->woke = false;
    resume(s, f);
    if (f->done) --live;
    if (s->woke) cursor = 0;  // fibers before the cursor may have been released
  }
  emu_tsan_acquire(&s->tsan_end);
}

void emu_fiber_wait(const uint64_t* gen, uint64_t seen) {
  EmuTsanIgnore ignore;  // the scheduler's state (ordered by the switches)
  Scheduler* s = t_sched;
  if (s == nullptr || s->current == nullptr) fail("a barrier outside a kernel");
  Fiber* f = s->current;
  f->wait = gen;
  f->seen = seen;
  suspend(f);  // resumed only once *gen != seen
  f->wait = nullptr;
}

void emu_fiber_yield() {
  EmuTsanIgnore ignore;  // the scheduler's state (ordered by the switches)
  Scheduler* s = t_sched;
  if (s == nullptr || s->current == nullptr) fail("a yield outside a kernel");
  s->woke = true;  // the scheduler looks again from its first fiber, which may be this one
  suspend(s->current);
}

void emu_fiber_woke() {
  EmuTsanIgnore ignore;
  if (t_sched != nullptr) t_sched->woke = true;
}

void emu_tsan_release(const void* addr) {
#if defined(EMU_TSAN)
  __tsan_release(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

void emu_tsan_acquire(const void* addr) {
#if defined(EMU_TSAN)
  __tsan_acquire(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}
