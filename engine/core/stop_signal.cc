#include "core/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace gpt {

namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the handler must not take a lock");

void on_signal(int sig) {
  if (sig == SIGINT && g_signal.load() == SIGINT) _exit(130);  // the second Ctrl-C: stop now
  g_signal.store(sig);
}

}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGUSR1, SIGTERM, SIGINT}) sigaction(sig, &sa, nullptr);
}

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
