// attention_bench (scripts/bench/attention_bench.cc) with --device cuda on the CUDA emulator's backend: the bench's
// CUDA path (every kernel choice, bf16 tensors, the alignment and scratch it needs) runs in CPU-only CI.
#include "attention_bench.h"
#include "kernels/cuda/cuda_backend.h"  // the emulator's conversion: gpt::CudaEmuBackend

int main(int argc, char** argv) {
  return gpt::attention_bench_main(argc, argv,
                                   [](std::string_view device) -> gpt::Expected<std::unique_ptr<gpt::Backend>> {
                                     if (device == "cuda")
                                       return std::unique_ptr<gpt::Backend>(std::make_unique<gpt::CudaEmuBackend>(0));
                                     return gpt::make_backend(device);
                                   });
}
