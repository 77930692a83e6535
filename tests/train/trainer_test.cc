// Training on real text: the loss falls within a bounded number of steps; gradient accumulation and the
// LR schedule behave as configured.
#include "train/trainer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "comm/communicator.h"
#include "config/loader.h"
#include "data/prepare.h"
#include "optim/lr_schedule.h"
#include "testing/temp_dir.h"

namespace gpt {
namespace {

TEST_CASE("Loss falls on Shakespeare within 150 steps", "[train]") {
  const std::string text = std::string(GPT_SHARED_DATA_DIR) + "/tinyshakespeare.txt";
  if (!std::filesystem::exists(text)) {
    WARN("SKIPPED: " << text << " not found (tests and CI expect ../shared/data beside the repository)");
    return;
  }
  testing::TempDir dir;
  data::PrepareOptions prep;
  prep.inputs = {text};
  prep.out_dir = dir.file("data");
  REQUIRE(data::prepare_dataset(prep).has_value());
  const std::string yaml = "run: {out_dir: " + dir.file("run") +
                           ", threads: 2}\n"
                           "model: {n_layer: 2, n_head: 4, n_embd: 64, block_size: 64}\n"
                           "data: {train: " + dir.file("data/train.bin") + ", val: " + dir.file("data/val.bin") +
                           "}\n"
                           "training: {steps: 150, micro_batch_size: 8, global_batch_sequences: 16, lr: 2.0e-3,\n"
                           "  warmup_steps: 20, eval_interval: 0, eval_batches: 10}\n";
  auto cfg = load_run_config_text(yaml, "test", {});
  REQUIRE(cfg.has_value());
  auto world = make_single_communicator();
  auto trainer = Trainer::create(*cfg, *world);
  REQUIRE(trainer.has_value());
  REQUIRE((*trainer)->shape().vocab_size == 65);
  const float initial = *(*trainer)->evaluate();
  REQUIRE(std::abs(initial - std::log(65.0f)) < 0.15f);  // near uniform at init
  auto summary = (*trainer)->run();
  REQUIRE(summary.has_value());
  REQUIRE(summary->final_val_loss.has_value());
  INFO("val loss " << initial << " -> " << *summary->final_val_loss);
  REQUIRE(*summary->final_val_loss < 2.6f);
}

TEST_CASE("LR schedule: linear warmup, cosine decay to min_lr", "[train]") {
  LrSchedule s;
  s.lr = 1e-3f;
  s.min_lr = 1e-4f;
  s.warmup_steps = 100;
  s.decay_steps = 2000;
  REQUIRE(s.at(0) == Approx(1e-3 / 101));
  REQUIRE(s.at(99) == Approx(1e-3 * 100 / 101));
  REQUIRE(s.at(100) == Approx(1e-3));
  REQUIRE(s.at(1050) == Approx(5.5e-4));
  REQUIRE(s.at(2000) == Approx(1e-4));
  REQUIRE(s.at(5000) == Approx(1e-4));
  s.kind = LrSchedule::Kind::kLinear;
  REQUIRE(s.at(1050) == Approx(5.5e-4));
  REQUIRE(s.at(575) == Approx(1e-3 - 0.25 * 9e-4));
}

}  // namespace
}  // namespace gpt
