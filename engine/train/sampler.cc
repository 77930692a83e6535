#include "train/sampler.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/model_file.h"
#include "config/run_config.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "model/inference_weights.h"

namespace gpt {

namespace {

// The token drawn from `logits` (scored.size() of them) by temperature, top-k and then top-p (as Hugging Face's
// generate applies them) with the uniform draw `u` in [0, 1).
int choose_token(const float* logits, const SampleOptions& o, double u, std::vector<std::pair<float, int>>& scored) {
  const int V = static_cast<int>(scored.size());
  for (int j = 0; j < V; ++j) scored[j] = {logits[j] / o.temperature, j};
  int k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::partial_sort(scored.begin(), scored.begin() + k, scored.end(), std::greater<>());
  // A temperature so small that logits / temperature overflow: its limit, the most likely token (inf - inf would
  // make every weight NaN and pick the k-th; the order among the infinities says nothing).
  if (!std::isfinite(scored[0].first)) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += std::exp(static_cast<double>(scored[j].first - scored[0].first));
  if (o.top_p < 1.0f) {  // the fewest most likely tokens whose probabilities reach top_p (top_p > 0: at least one)
    double kept = 0.0;
    int n = 0;
    while (n < k && kept < static_cast<double>(o.top_p) * sum) {
      kept += std::exp(static_cast<double>(scored[n].first - scored[0].first));
      ++n;
    }
    k = n;
    sum = kept;
  }
  u *= sum;
  for (int j = 0; j < k; ++j) {
    u -= std::exp(static_cast<double>(scored[j].first - scored[0].first));
    if (u <= 0.0) return scored[j].second;
  }
  return scored[k - 1].second;
}

}  // namespace

Status sample_text(const SampleOptions& o, const std::function<void(const std::string&)>& emit) {
  if (!(std::isfinite(o.temperature) && o.temperature > 0.0f)) {
    return Status::invalid_argument("--temperature must be a finite number > 0, got " + std::to_string(o.temperature));
  }
  if (o.top_k < 0)
    return Status::invalid_argument("--top-k must be >= 0 (0 = every token), got " + std::to_string(o.top_k));
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) {
    return Status::invalid_argument("--top-p must be in (0, 1] (1 = off), got " + std::to_string(o.top_p));
  }
  if (o.threads < 0 || o.threads > kMaxThreads) {
    return Status::invalid_argument("--threads must be in [0, " + std::to_string(kMaxThreads) +
                                    "] (0 = all cores), got " + std::to_string(o.threads));
  }
  if (o.tokens < 0) return Status::invalid_argument("--tokens must be >= 0");
  if (o.num_samples < 1) return Status::invalid_argument("--num-samples must be >= 1");
  auto made = make_backend(o.device);  // first: a missing GPU is known before a large model is read
  if (!made) return made.status().with_context("--device");
  std::unique_ptr<Backend> backend = std::move(*made);
  backend->set_threads(o.threads);
  GPT_ASSIGN_OR_RETURN(SavedModel saved, load_model(o.model_dir));
  const bool text_in = o.prompt_ids.empty(), text_out = !o.emit_ids;
  std::optional<data::Tokenizer> tok;
  if (text_in || text_out) {
    if (saved.tokenizer_path.empty()) {
      return Status::failed_precondition(
          "'" + o.model_dir + "' has no tokenizer.json (its data was tokenized elsewhere), so text cannot be " +
          (text_in ? "encoded" : "decoded") +
          ": give the prompt as token ids with --prompt-ids and take token ids out with --ids (for GPT-2 BPE, "
          "tiktoken's gpt2 encoding makes and reads them)");
    }
    GPT_ASSIGN_OR_RETURN(data::Tokenizer loaded, data::Tokenizer::load(saved.tokenizer_path));
    if (loaded.vocab_size() > saved.shape.vocab_size) {  // the model was trained with at least its symbols
      return Status::corruption(saved.tokenizer_path + ": " + std::to_string(loaded.vocab_size()) +
                                " symbols, more than the model's vocabulary of " +
                                std::to_string(saved.shape.vocab_size) + ": not the tokenizer it was trained with");
    }
    tok.emplace(std::move(loaded));
  }
  std::vector<int32_t> ids = o.prompt_ids;
  if (text_in) {
    auto encoded = tok->encode_with_specials(o.prompt);
    if (!encoded && o.prompt_is_default) {
      return encoded.status().with_context(
          "--prompt not given, so the default prompt (a newline) is used, but this model's vocabulary lacks it: give "
          "one with --prompt TEXT or --prompt-ids");
    }
    if (!encoded) return encoded.status().with_context("--prompt");
    ids.assign(encoded->begin(), encoded->end());
  }
  const char* prompt_flag = text_in ? "--prompt" : "--prompt-ids";
  if (ids.empty()) return Status::invalid_argument(std::string(prompt_flag) + " is empty");
  for (int32_t id : ids) {
    if (id < 0 || id >= saved.shape.vocab_size) {
      return Status::invalid_argument(std::string(prompt_flag) + " has token " + std::to_string(id) +
                                      ", outside the model's vocabulary of " + std::to_string(saved.shape.vocab_size));
    }
  }
  auto piece = [&](std::span<const int32_t> some, bool first) {
    if (text_out) return tok->decode(some);
    std::string out;
    for (const int32_t id : some) {
      if (!first || !out.empty()) out += ' ';
      out += std::to_string(id);
    }
    return out;
  };

  saved.shape.dropout = 0.0f;
  Gpt model(saved.shape, *backend);
  InferenceWeights params(model.layout(), *backend, saved.weights);  // read in place on the CPU

  const CounterRng rng(o.seed, hash_name("sample"));
  // Decoding to text, ids the tokenizer has no symbol for (a model's vocabulary padded past it) are never drawn, as
  // llm.c samples GPT-2's 50257 of its 50304 rows.
  std::vector<std::pair<float, int>> scored(text_out ? std::min(saved.shape.vocab_size, tok->vocab_size())
                                                     : saved.shape.vocab_size);
  // The model's KV cache holds ids[0, cached). Past the block size the context is the last block_size tokens, each
  // at a new position every step, so no cached row stays valid: the window runs whole, as a forward over it would.
  const int block = saved.shape.block_size;
  model.prepare_decode(static_cast<int>(std::min<int64_t>(block, static_cast<int64_t>(ids.size()) + o.tokens)));
  const std::vector<int32_t> prompt = ids;
  for (int sample = 0; sample < o.num_samples; ++sample) {
    if (sample > 0) emit("\n---------------\n");  // nanoGPT's separator
    ids = prompt;
    emit(text_in && text_out ? o.prompt : piece(ids, /*first=*/true));
    // Sample s draws from its own stretch of the RNG's counters (sample 0's are those of a single sample).
    const uint64_t first_draw = static_cast<uint64_t>(sample) << 32;
    int cached = 0;
    for (int i = 0; i < o.tokens; ++i) {
      const int len = static_cast<int>(ids.size());
      const float* last = nullptr;
      if (len <= block) {
        last = model.decode(params, ids.data() + cached, len - cached, cached);
        cached = len;
      } else {
        last = model.decode(params, ids.data() + len - block, block, 0);
      }
      const int next = choose_token(last, o, rng.uniform(first_draw + static_cast<uint64_t>(i)), scored);
      ids.push_back(next);
      const int32_t one[1] = {next};
      emit(piece(std::span<const int32_t>(one, 1), /*first=*/false));
    }
  }
  return Status::ok();
}

}  // namespace gpt
