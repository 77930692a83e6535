#include "config/validate.h"

#include <initializer_list>

#include "config/schema.h"

namespace gpt {
namespace {

// The place to fix a rule between keys: where the first of them that was set came from.
std::string place_of(const RunConfig& cfg, std::initializer_list<const char*> keys, const std::string& source) {
  for (const char* k : keys) {
    auto it = cfg.origin.find(k);
    if (it != cfg.origin.end()) return it->second;
  }
  return source;
}

// A key's value as the schema writes it (floats in shortest form: "0.001").
std::string value_of(const RunConfig& cfg, std::string_view key) { return format_value(*find_config_key(key), cfg); }

Status cross_key_rules(const RunConfig& cfg, const std::string& source) {
  const ModelSection& m = cfg.model;
  const TrainingSection& t = cfg.training;
  auto fail = [&](std::initializer_list<const char*> keys, const std::string& msg) {
    return Status::invalid_argument(place_of(cfg, keys, source) + ": " + msg);
  };
  if (m.n_embd % m.n_head != 0) {
    return fail({"model.n_embd", "model.n_head"}, "model.n_embd: must be a multiple of model.n_head (" +
                                                      std::to_string(m.n_head) + "), got " + std::to_string(m.n_embd));
  }
  if (t.global_batch_sequences > 0 && t.global_batch_tokens > 0) {
    return fail({"training.global_batch_tokens", "training.global_batch_sequences"},
                "training.global_batch_tokens: cannot be set together with training.global_batch_sequences; set one");
  }
  if (t.global_batch_sequences > 0 && t.global_batch_sequences % t.micro_batch_size != 0) {
    return fail({"training.global_batch_sequences", "training.micro_batch_size"},
                "training.global_batch_sequences: must be a multiple of training.micro_batch_size (" +
                    std::to_string(t.micro_batch_size) + "), got " + std::to_string(t.global_batch_sequences));
  }
  const int64_t micro_tokens = int64_t{m.block_size} * t.micro_batch_size;
  if (t.global_batch_tokens > 0 && t.global_batch_tokens % micro_tokens != 0) {
    return fail({"training.global_batch_tokens", "model.block_size", "training.micro_batch_size"},
                "training.global_batch_tokens: must be a multiple of model.block_size * training.micro_batch_size (" +
                    std::to_string(m.block_size) + " * " + std::to_string(t.micro_batch_size) + " = " +
                    std::to_string(micro_tokens) + "), got " + std::to_string(t.global_batch_tokens));
  }
  if (t.min_lr > t.lr) {
    return fail({"training.min_lr", "training.lr"}, "training.min_lr: must be <= training.lr (" +
                                                        value_of(cfg, "training.lr") + "), got " +
                                                        value_of(cfg, "training.min_lr"));
  }
  if (cfg.parallel.stochastic_rounding && cfg.parallel.param_dtype != "bf16") {
    return fail({"parallel.stochastic_rounding", "parallel.param_dtype"},
                "parallel.stochastic_rounding: rounds bf16 parameters; it needs parallel.param_dtype: bf16, got " +
                    cfg.parallel.param_dtype);
  }
  // Choices among the CUDA backend's bf16 kernels: only under run.device cuda and parallel.param_dtype bf16.
  const bool cuda_bf16 = cfg.run.device == "cuda" && cfg.parallel.param_dtype == "bf16";
  auto needs_cuda_bf16 = [&](const char* key, const std::string& value, const std::string& what) {
    return fail({key, "run.device", "parallel.param_dtype"},
                std::string(key) + ": " + value + " " + what +
                    "; it needs run.device: cuda and parallel.param_dtype: bf16, got run.device: " + cfg.run.device +
                    ", parallel.param_dtype: " + cfg.parallel.param_dtype);
  };
  if (cfg.run.gelu_fusion != "none" && cfg.run.gelu_fusion != "auto" && !cuda_bf16) {
    return needs_cuda_bf16("run.gelu_fusion", cfg.run.gelu_fusion, "fuses the GELU into bf16 cuBLASLt GEMMs");
  }
  if (cfg.run.attention_kernel != "auto" && !cuda_bf16) {
    return needs_cuda_bf16("run.attention_kernel", cfg.run.attention_kernel,
                           "chooses between bf16 tensor-core kernels");
  }
  if (t.decay_steps != 0 && t.decay_steps < t.warmup_steps) {
    return fail({"training.decay_steps", "training.warmup_steps"},
                "training.decay_steps: must be 0 or >= training.warmup_steps (" + std::to_string(t.warmup_steps) +
                    "), got " + std::to_string(t.decay_steps));
  }
  return Status::ok();
}

}  // namespace

Status validate_run_config(const RunConfig& cfg, const std::string& source_name) {
  for (const KeySpec& spec : config_schema()) {
    Status st = check_allowed(spec, cfg);
    if (!st.is_ok()) {
      auto it = cfg.origin.find(std::string(spec.key));
      return Status::invalid_argument((it == cfg.origin.end() ? source_name : it->second) + ": " + st.message());
    }
  }
  return cross_key_rules(cfg, source_name);
}

}  // namespace gpt
