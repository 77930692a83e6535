#include "backend/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace gpt {

std::unique_ptr<Backend> make_backend(std::string_view device) {
  if (device == "cpu") return std::make_unique<CpuBackend>();
  return nullptr;
}

}  // namespace gpt
