#include "config/run_config.h"

namespace gpt {

std::string RunConfig::gelu_fusion() const {
  if (run.gelu_fusion != "auto") return run.gelu_fusion;
  return run.device == "cuda" && parallel.param_dtype == "bf16" ? "full" : "none";
}

int64_t RunConfig::global_batch() const {
  if (training.global_batch_sequences > 0) return training.global_batch_sequences;
  if (training.global_batch_tokens > 0) return training.global_batch_tokens / model.block_size;
  return training.micro_batch_size;
}

}  // namespace gpt
