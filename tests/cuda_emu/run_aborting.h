// For the emulated-kernel tests: runs code that must abort (a GPU fault, a failed check) in a child process.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <utility>

namespace gpt::emu_test {

// Runs f in a child process; returns what it wrote to stdout and stderr (spdlog's console and the emulator's
// messages), and whether it died of SIGABRT.
template <class F>
std::pair<std::string, bool> run_aborting(F f) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {  // the child: no Catch signal handler (it would report the abort as a failed test)
    close(fds[0]);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::signal(SIGABRT, SIG_DFL);
    f();
    std::fflush(nullptr);
    _exit(0);  // did not abort
  }
  close(fds[1]);
  std::string err;
  char buf[256];
  for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) err.append(buf, static_cast<size_t>(r));
  close(fds[0]);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return {err, WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT};
}

}  // namespace gpt::emu_test
