#include "core/stop_signal.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

namespace gpt {

namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_armed{false};

// The stop signals this process was not started ignoring (a shell's background job ignores SIGINT, nohup
// SIGHUP): a blocked signal is taken by sigwait even when ignored, so an ignored one stays out of the set and
// keeps being ignored.
sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGUSR1, SIGTERM, SIGINT}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaddset(&set, sig);
  }
  return set;
}

// Ends the process as the signal's default action would (its exit status says which signal).
[[noreturn]] void die_of(int sig) {
  signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);  // this thread only; raise() targets it
  raise(sig);
  _exit(128 + sig);  // not reached for a terminating signal
}

void wait_for_signals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (!g_armed.load()) die_of(sig);
    if (sig == SIGINT && g_signal.load() == SIGINT) _exit(130);  // the second Ctrl-C: stop now
    g_signal.store(sig);
  }
}

}  // namespace

void block_stop_signals() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(wait_for_signals, set).detach();  // inherits the block; sigwait takes the signals from it
}

void arm_stop_signals() { g_armed.store(true); }

int stop_signal() { return g_signal.load(); }
void clear_stop_signal() { g_signal.store(0); }

const char* stop_signal_name(int sig) {
  switch (sig) {
    case SIGUSR1:
      return "SIGUSR1";
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
  }
  static thread_local char buf[32];
  std::snprintf(buf, sizeof(buf), "signal %d", sig);
  return buf;
}

}  // namespace gpt
