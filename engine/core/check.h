// GPT_CHECK: for broken invariants and library failures (CUDA, NCCL, cuBLAS, MPI), never for errors a
// user can cause (those return a Status). Prints the failed statement, file and line, then aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace gpt::internal {
[[noreturn]] void check_failed(const char* expr, const char* file, int line, const char* msg);
}  // namespace gpt::internal

#define GPT_CHECK(cond)                                                                     \
  do {                                                                                      \
    if (!(cond)) ::gpt::internal::check_failed(#cond, __FILE__, __LINE__, nullptr);         \
  } while (0)

#define GPT_CHECK_MSG(cond, msg)                                                            \
  do {                                                                                      \
    if (!(cond)) ::gpt::internal::check_failed(#cond, __FILE__, __LINE__, (msg));           \
  } while (0)
