// cuBLASLt, loaded when the first CUDA backend is made rather than when gpt-train starts. Linked at start, its
// library (540 MB) cost every process about 0.09 s and 210 MB of resident memory (its relocations), a CPU run's
// ranks included. The cuBLASLt functions gpt-train calls are defined in cublaslt_loader.cc under their own names,
// each forwarding to the library's, which load_cublaslt opens with dlopen by its soname (found where the dynamic
// linker found it before: LD_LIBRARY_PATH, the binary's RUNPATH, the system's).
#pragma once

#include "core/status.h"

namespace gpt::cuda {

// Opens libcublasLt once (later calls return the first call's result) and checks that it has every function
// gpt-train calls: an error names the library and says why (dlerror). make_backend("cuda") calls it first, so that a
// missing library is an error, not a cuBLASLt call's CUBLAS_STATUS_NOT_INITIALIZED (the forwarding functions open the
// library themselves on their first call too).
Status load_cublaslt();

}  // namespace gpt::cuda
