// The one place backends are registered (and the one place the CUDA backend is named under #ifdef).
#include "backend/backend.h"
#include "comm/communicator.h"
#include "kernels/cpu/cpu_backend.h"
#ifdef GPT_WITH_CUDA
#include "comm/nccl_communicator.h"
#include "kernels/cuda/cublaslt_loader.h"
#include "kernels/cuda/cuda_backend.h"
#endif

namespace gpt {

Expected<GeluFusion> parse_gelu_fusion(std::string_view name) {
  if (name == "none") return GeluFusion::kNone;
  if (name == "forward") return GeluFusion::kForward;
  if (name == "full") return GeluFusion::kFull;
  return Status::invalid_argument("expected one of none|forward|full, got '" + std::string(name) + "'");
}

Expected<AttentionKernel> parse_attention_kernel(std::string_view name) {
  if (name == "auto") return AttentionKernel::kAuto;
  if (name == "wmma") return AttentionKernel::kWmma;
  return Status::invalid_argument("expected one of auto|wmma, got '" + std::string(name) + "'");
}

Expected<std::unique_ptr<Backend>> make_backend(std::string_view device, int local_rank, int local_size) {
  if (device == "cpu") return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  if (device == "cuda") {
#ifdef GPT_WITH_CUDA
    if (Status st = cuda::load_cublaslt(); !st.is_ok()) return st.with_context("device 'cuda'");
    return make_cuda_backend(local_rank, local_size);
#else
    (void)local_rank;
    (void)local_size;
    return Status::failed_precondition(
        "device 'cuda': this gpt-train was built without CUDA (configure with -DGPT_CUDA=ON where nvcc is found)");
#endif
  }
  return Status::invalid_argument("device '" + std::string(device) + "': expected cpu or cuda");
}

Expected<std::unique_ptr<Communicator>> make_device_communicator(Communicator& bootstrap, const Backend& backend,
                                                                 std::string name) {
#ifdef GPT_WITH_CUDA
  if (backend.device_index() >= 0) {
    return make_nccl_communicator(bootstrap, backend.device_index(), backend.native_stream(), std::move(name));
  }
#else
  (void)bootstrap;
  (void)name;
#endif
  return Status::failed_precondition("backend '" + std::string(backend.name()) +
                                     "' has no device communicator: its buffers are host memory");
}

}  // namespace gpt
