#include "kernels/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <mutex>
#include <string>
#include <type_traits>

namespace gpt::cuda {

namespace {

#define GPT_STR2(x) #x
#define GPT_STR(x) GPT_STR2(x)
// The soname of the cuBLASLt this was built against (libcublasLt.so.13 for CUDA 13).
constexpr const char* kLibrary = "libcublasLt.so." GPT_STR(CUBLAS_VER_MAJOR);

struct Library {
  void* handle = nullptr;
  std::string error;
};

const Library& library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    lib.handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle == nullptr) {
      const char* why = dlerror();
      lib.error = std::string(kLibrary) + " could not be loaded (" + (why != nullptr ? why : "no reason given") +
                  "): the CUDA toolkit's cuBLASLt must be on the library path (LD_LIBRARY_PATH)";
    }
  });
  return lib;
}

// The library's function `name` as a pointer of the type F, or null when the library or the function is missing.
template <typename F>
F* symbol(const char* name) {
  const Library& lib = library();
  return lib.handle != nullptr ? reinterpret_cast<F*>(dlsym(lib.handle, name)) : nullptr;
}

}  // namespace

Status load_cublaslt() {
  const Library& lib = library();
  if (lib.handle == nullptr) return Status::failed_precondition(lib.error);
  // Each function gpt-train calls (below): a library without one of them is not the cuBLASLt this was built for.
  for (const char* name :
       {"cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion", "cublasLtGetStatusString", "cublasLtMatmul",
        "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy", "cublasLtMatmulDescCreate",
        "cublasLtMatmulDescDestroy", "cublasLtMatmulDescSetAttribute", "cublasLtMatmulPreferenceCreate",
        "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulAlgoGetHeuristic",
        "cublasLtMatmulAlgoConfigGetAttribute", "cublasLtMatmulAlgoCheck"}) {
    if (dlsym(lib.handle, name) == nullptr) {
      return Status::failed_precondition(std::string(kLibrary) + " has no " + name + ": not the cuBLASLt " +
                                         "gpt-train was built against (CUDA " + GPT_STR(CUBLAS_VER_MAJOR) + ")");
    }
  }
  return Status::ok();
}

}  // namespace gpt::cuda

// The forwarding definitions: the declarations in cublasLt.h (extern "C") fix each one's type, so a parameter list
// written here that differs from the header's does not compile.
#define GPT_CUBLASLT_FORWARD(ret, name, params, args, missing)                               \
  ret CUBLASWINAPI name params {                                                             \
    static auto* const f = gpt::cuda::symbol<std::remove_pointer_t<decltype(&name)>>(#name); \
    return f != nullptr ? f args : (missing);                                                \
  }

extern "C" {

GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(size_t, cublasLtGetVersion, (void), (), size_t{0})
GPT_CUBLASLT_FORWARD(const char*, cublasLtGetStatusString, (cublasStatus_t status), (status),
                     "(libcublasLt not loaded)")
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmul,
                     (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                      cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                      const void* C, cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                      const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream),
                     (handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                      workspace_bytes, stream),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutCreate,
                     (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
                     (layout, type, rows, cols, ld), CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulDescCreate,
                     (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
                     (desc, compute, scale), CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulDescSetAttribute,
                     (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t size),
                     (desc, attr, buf, size), CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
                     (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                      size_t size),
                     (pref, attr, buf, size), CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
                     (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                      cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                      cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
                      int* returned),
                     (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned),
                     CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoConfigGetAttribute,
                     (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
                      size_t size, size_t* written),
                     (algo, attr, buf, size, written), CUBLAS_STATUS_NOT_INITIALIZED)
GPT_CUBLASLT_FORWARD(cublasStatus_t, cublasLtMatmulAlgoCheck,
                     (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                      cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                      const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result),
                     (handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo, result), CUBLAS_STATUS_NOT_INITIALIZED)

}  // extern "C"
