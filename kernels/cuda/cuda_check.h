// CUDA error checks for host code: a failed CUDA runtime call or kernel launch is a broken invariant (or
// a broken GPU), so it aborts through GPT_CHECK with the statement, file, line and CUDA's own message.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "core/check.h"

#define GPT_CUDA_CHECK(call)                                                                                    \
  do {                                                                                                          \
    const cudaError_t gpt_err_ = (call);                                                                        \
    GPT_CHECK_MSG(gpt_err_ == cudaSuccess, (std::string(#call) + ": " + cudaGetErrorString(gpt_err_)).c_str()); \
  } while (0)

// After a <<<...>>> launch: catches bad launch configurations at once (execution errors surface at the
// next synchronising call).
#define GPT_CUDA_CHECK_LAUNCH() GPT_CUDA_CHECK(cudaGetLastError())
