#include "train/sampler.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/model_file.h"
#include "comm/communicator.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "parallel/sharded_params.h"

namespace gpt {

Status sample_text(const SampleOptions& o, const std::function<void(const std::string&)>& emit) {
  if (o.temperature <= 0.0f) return Status::invalid_argument("--temperature must be > 0");
  if (o.tokens < 0) return Status::invalid_argument("--tokens must be >= 0");
  GPT_ASSIGN_OR_RETURN(SavedModel saved, load_model(o.model_dir));
  if (saved.tokenizer_path.empty()) {
    return Status::failed_precondition("'" + o.model_dir + "' has no tokenizer.json, so text cannot be decoded");
  }
  GPT_ASSIGN_OR_RETURN(data::Tokenizer tok, data::Tokenizer::load(saved.tokenizer_path));
  auto encoded = tok.encode(o.prompt);
  if (!encoded) return encoded.status().with_context("--prompt");
  std::vector<int32_t> ids(encoded->begin(), encoded->end());
  if (ids.empty()) return Status::invalid_argument("--prompt is empty");
  for (int32_t id : ids) {
    if (id >= saved.shape.vocab_size) return Status::invalid_argument("--prompt has a token outside the model's vocab");
  }

  auto backend = std::move(*make_backend("cpu"));
  backend->set_threads(o.threads);
  saved.shape.dropout = 0.0f;
  Gpt model(saved.shape, *backend);
  auto single = make_single_communicator();
  ShardedParams params(model.layout(), *backend, *single, Strategy::kSingle);
  std::copy(saved.weights.begin(), saved.weights.end(), params.master());

  emit(o.prompt);
  const CounterRng rng(o.seed, hash_name("sample"));
  const int V = saved.shape.vocab_size;
  std::vector<std::pair<float, int>> scored(V);
  for (int i = 0; i < o.tokens; ++i) {
    const int T = std::min<int>(static_cast<int>(ids.size()), saved.shape.block_size);
    model.prepare(1, T);
    const float* logits = model.forward_logits(params, ids.data() + ids.size() - T, StepContext{0, 0, 0, false});
    const float* last = logits + static_cast<int64_t>(T - 1) * V;
    for (int j = 0; j < V; ++j) scored[j] = {last[j] / o.temperature, j};
    const int k = o.top_k > 0 ? std::min(o.top_k, V) : V;
    std::partial_sort(scored.begin(), scored.begin() + k, scored.end(), std::greater<>());
    double sum = 0.0;
    for (int j = 0; j < k; ++j) sum += std::exp(static_cast<double>(scored[j].first - scored[0].first));
    double u = rng.uniform(static_cast<uint64_t>(i)) * sum;
    int next = scored[k - 1].second;
    for (int j = 0; j < k; ++j) {
      u -= std::exp(static_cast<double>(scored[j].first - scored[0].first));
      if (u <= 0.0) {
        next = scored[j].second;
        break;
      }
    }
    ids.push_back(next);
    const int32_t one[1] = {next};
    emit(tok.decode(std::span<const int32_t>(one, 1)));
  }
  return Status::ok();
}

}  // namespace gpt
