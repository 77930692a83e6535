// cuBLASLt is opened when the first CUDA backend is made (kernels/cuda/cublaslt_loader.h): the forwarding
// definitions reach the library's functions once load_cublaslt has opened it. Runs without a GPU (no function
// here needs one); that gpt-train does not load it at start is checked by cli_test's "help, version" case.
#include "kernels/cuda/cublaslt_loader.h"

#include <cublasLt.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

namespace gpt::cuda {
namespace {

TEST_CASE("cuBLASLt: loaded on demand, its functions forwarded", "[kernels]") {
  const Status st = load_cublaslt();
  INFO(st.message());
  REQUIRE(st.is_ok());
  CHECK(load_cublaslt().is_ok());  // once; the same answer after
  CHECK(cublasLtGetVersion() / 10000 == CUBLAS_VER_MAJOR);
  const std::string why = cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED);  // the library's words, not ours
  CHECK(why.find("not supported") != std::string::npos);
  cublasLtMatrixLayout_t layout = nullptr;  // host-side descriptors: no device needed
  REQUIRE(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 64, 32, 64) == CUBLAS_STATUS_SUCCESS);
  CHECK(layout != nullptr);
  CHECK(cublasLtMatrixLayoutDestroy(layout) == CUBLAS_STATUS_SUCCESS);
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  CHECK(text.str().find("libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR)) != std::string::npos);
}

}  // namespace
}  // namespace gpt::cuda
