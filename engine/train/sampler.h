// Text generation from saved weights: autoregressive sampling with temperature, top-k and top-p over the model's KV
// cache, the context cropped to the model's block size. Randomness comes from the counter-based RNG keyed by the seed
// and the token index, so a seed reproduces the same text.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace gpt {

struct SampleOptions {
  std::string model_dir;  // a model directory (manifest.json + shard), e.g. <run out_dir>/model
  std::string prompt = "\n";
  bool prompt_is_default = false;  // the user gave no prompt (an error that `prompt` cannot be encoded says so)
  int tokens = 300;
  int num_samples = 1;       // continuations of the prompt, each from its own random draws, separated by a dashed line
  float temperature = 0.8f;  // > 0
  int top_k = 40;            // 0 = the whole vocabulary
  float top_p = 1.0f;        // (0, 1]: after top-k, the fewest most likely tokens whose probabilities reach it; 1 = off
  uint64_t seed = 1;
  int threads = 0;
  std::string device = "cpu";  // cpu, or cuda (the first visible GPU; fp32 compute, as the CPU)
  // Token ids instead of text, for a model whose data was tokenized elsewhere (no tokenizer.json; e.g. llm.c's
  // GPT-2 BPE shards, decoded with tiktoken): the prompt's ids (used instead of `prompt` when not empty), and
  // whether to emit ids (space-separated, the prompt's first) instead of decoded text.
  std::vector<int32_t> prompt_ids;
  bool emit_ids = false;
};

// Generates `tokens` tokens after the prompt; `emit` receives the prompt's text and then each new piece
// of text as it is produced. Errors: missing/corrupt model, no tokenizer, prompt not encodable.
[[nodiscard]] Status sample_text(const SampleOptions& options, const std::function<void(const std::string&)>& emit);

}  // namespace gpt
