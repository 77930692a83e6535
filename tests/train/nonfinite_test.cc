// The NaN/Inf guard: a non-finite gradient (injected through the GPT_TRAIN_FAULT hook, as an overflow would
// produce) stops the run naming the step and the first unit, or under skip_step leaves the weights exactly
// as they were before that step and trains on.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>

#include "comm/communicator.h"
#include "config/loader.h"
#include "testing/temp_dir.h"
#include "testing/tiny_corpus.h"
#include "train/trainer.h"

namespace gpt {
namespace {

struct FaultEnv {  // sets GPT_TRAIN_FAULT for one scope
  explicit FaultEnv(const char* value) { ::setenv("GPT_TRAIN_FAULT", value, 1); }
  ~FaultEnv() { ::unsetenv("GPT_TRAIN_FAULT"); }
};

RunConfig config(const testing::TempDir& dir, const std::string& out, int steps, const std::string& mode) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "a stitch in time saves nine " + std::to_string(i % 5) + "\n";
  testing::prepare_corpus(dir, text);
  const std::string yaml = "run: {out_dir: " + dir.file(out) + ", threads: 1}\n" +
                           "model: {n_layer: 2, n_head: 2, n_embd: 16, block_size: 16}\n" +
                           "data: {train: " + dir.file("data/train.bin") + ", val: " + dir.file("data/val.bin") +
                           "}\ntraining: {steps: " + std::to_string(steps) +
                           ", micro_batch_size: 2, global_batch_sequences: 4, warmup_steps: 1, decay_steps: 10, "
                           "eval_interval: 0, eval_batches: 1, nonfinite: " +
                           mode + "}\nlogging: {level: error}\n";
  auto cfg = load_run_config_text(yaml, "nonfinite_test", {});
  REQUIRE(cfg.has_value());
  return *cfg;
}

TEST_CASE("A non-finite gradient stops the run naming the step and the first bad unit", "[train]") {
  testing::TempDir dir;
  auto world = make_single_communicator();
  FaultEnv fault("nan_grad:3:2");  // unit 2 = block.1
  auto trainer = Trainer::create(config(dir, "stop", 5, "stop"), *world);
  REQUIRE(trainer.has_value());
  auto run = (*trainer)->run();
  REQUIRE(!run.has_value());
  INFO(run.status().message());
  CHECK(run.status().message().find("step 3: loss") != std::string::npos);
  CHECK(run.status().message().find("the first unit with a non-finite gradient is 'block.1'") != std::string::npos);
}

TEST_CASE("training.nonfinite: skip_step skips exactly that update", "[train]") {
  testing::TempDir dir;
  auto world = make_single_communicator();
  // Two clean steps, against three steps whose third gradient is poisoned and skipped.
  auto two = Trainer::create(config(dir, "two", 2, "skip_step"), *world);
  REQUIRE(two.has_value());
  REQUIRE((*two)->run().has_value());
  std::vector<float> want = (*two)->full_weights();
  FaultEnv fault("nan_grad:3:0");
  auto three = Trainer::create(config(dir, "three", 3, "skip_step"), *world);
  REQUIRE(three.has_value());
  auto run = (*three)->run();
  REQUIRE(run.has_value());
  CHECK((*three)->full_weights() == want);
  std::ifstream metrics(dir.file("three/metrics.jsonl"));
  std::string line, last;
  while (std::getline(metrics, line)) last = line;
  CHECK(last.find(R"("step":3,)") != std::string::npos);
  CHECK(last.find(R"("skipped":true,)") != std::string::npos);
  CHECK(last.find(R"("grad_norm":null,)") != std::string::npos);
}

}  // namespace
}  // namespace gpt
