// Trainer: one training run from a validated RunConfig. create() checks everything that can be checked
// before anything is written (data files, tokenizer, vocab and block size against the data) and allocates
// the model; run() creates out_dir, saves the resolved config, trains (micro-batches with gradient
// accumulation, global-norm clipping, AdamW, LR schedule), evaluates every eval_interval steps, writes
// metrics JSONL, logs progress, and saves the final weights and tokenizer into out_dir/model.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "core/status.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "parallel/local_params.h"

namespace gpt {

struct TrainSummary {
  int64_t steps = 0;
  float final_loss = 0.0f;
  std::optional<float> final_val_loss;
  double seconds = 0.0;
  double tokens_per_s = 0.0;
};

class Trainer {
 public:
  static Expected<std::unique_ptr<Trainer>> create(const RunConfig& config);
  Expected<TrainSummary> run();

  // Mean validation loss over eval_batches micro-batches (the same batches at every evaluation).
  float evaluate();
  const GptShape& shape() const { return shape_; }
  // FLOPs per token of one training step by 6N + 12 L H Q T (N without position embeddings).
  double flops_per_token() const;

 private:
  Trainer(const RunConfig& config, GptShape shape, data::DataLoader train, data::DataLoader val,
          std::optional<data::Tokenizer> tokenizer, ActivationCheckpointing ckpt);
  float train_step(int64_t step);

  RunConfig config_;
  GptShape shape_;
  data::DataLoader train_, val_;
  std::optional<data::Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Gpt> model_;
  std::unique_ptr<LocalParams> params_;
  std::unique_ptr<AdamW> optimizer_;
  LrSchedule schedule_;
  std::vector<int32_t> inputs_, targets_;  // one micro-batch
  double last_grad_norm_ = 0.0;
};

}  // namespace gpt
