// The Trainer on a device backend without a GPU: FakeDeviceBackend (parallel/fake_device.h), whose pointers fault
// if host code reads or writes them, and FakeDeviceCommunicator in place of NCCL. Every strategy trains, evaluates,
// checkpoints (staged through host memory) and resumes through the backend only, as it must on a GPU, and computes
// what the CPU backend computes, bit for bit. Under param_dtype bf16 the Trainer computes in bf16 on a device (as
// on a GPU: bf16-only parameters), and a run resumed from its checkpoint continues exactly.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "config/loader.h"
#include "parallel/fake_device.h"
#include "parallel/run_helpers.h"
#include "testing/temp_dir.h"
#include "testing/tiny_corpus.h"
#include "train/trainer.h"

namespace gpt {
namespace {

RunConfig config(const testing::TempDir& dir, const std::string& out, const std::string& strategy,
                 const std::string& dtype, const std::string& resume = "") {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox " + std::to_string(i % 7) + " jumps over\n";
  testing::prepare_corpus(dir, text);
  const std::string yaml =
      "run: {out_dir: " + dir.file(out) + ", threads: 1}\n" +
      "model: {n_layer: 2, n_head: 2, n_embd: 16, block_size: 16, dropout: 0.1}\n" +
      "data: {train: " + dir.file("data/train.bin") + ", val: " + dir.file("data/val.bin") + "}\n" +
      "training: {steps: 6, micro_batch_size: 2, global_batch_sequences: 4, warmup_steps: 1, eval_interval: 3, "
      "eval_batches: 1, activation_checkpointing: selective}\n" +
      "parallel: {strategy: " + strategy + ", param_dtype: " + dtype + ", reduce_dtype: " + dtype + "}\n" +
      "checkpoint: {every: 3" + (resume.empty() ? "" : ", resume: " + resume) + "}\n" + "logging: {level: error}\n";
  auto cfg = load_run_config_text(yaml, "device_trainer_test", {});
  REQUIRE(cfg.has_value());
  return *cfg;
}

Result train_on(const RunConfig& cfg, bool device) {
  auto world = make_single_communicator();
  TrainerHooks hooks;
  if (device) {
    hooks.backend = std::make_unique<testing::FakeDeviceBackend>();
    hooks.device_communicator = [](Communicator& bootstrap, const Backend&,
                                   std::string) -> Expected<std::unique_ptr<Communicator>> {
      return std::unique_ptr<Communicator>(std::make_unique<testing::FakeDeviceCommunicator>(bootstrap));
    };
  }
  Result r = run_trainer(cfg, *world, std::move(hooks));
  REQUIRE(r.val_loss.has_value());
  CHECK(r.allocations_after_first_step == 0);
  return r;
}

TEST_CASE("The Trainer on a device backend touches its memory only through it, and trains as on the CPU",
          "[train][parallel]") {
  for (const char* strategy : {"single", "ddp", "zero1", "zero2", "zero3"}) {
    CAPTURE(strategy);
    testing::TempDir dir;
    const Result cpu = train_on(config(dir, "cpu", strategy, "fp32"), false);
    const Result dev = train_on(config(dir, "dev", strategy, "fp32"), true);
    REQUIRE(cpu.losses.size() == 6);
    CHECK(dev.losses == cpu.losses);
    CHECK(dev.val_loss == cpu.val_loss);
    CHECK(dev.weights == cpu.weights);
    // bf16: bf16 compute on the device; resumed from the step-3 checkpoint, the last three steps are the same.
    const Result whole = train_on(config(dir, "bf16", strategy, "bf16"), true);
    const Result resumed =
        train_on(config(dir, "bf16-resumed", strategy, "bf16", dir.file("bf16/checkpoints/step_00000003")), true);
    REQUIRE(resumed.losses.size() == 3);
    CHECK(std::vector<float>(whole.losses.begin() + 3, whole.losses.end()) == resumed.losses);
    CHECK(resumed.weights == whole.weights);
    CHECK(whole.losses != cpu.losses);  // it is bf16 arithmetic
  }
}

}  // namespace
}  // namespace gpt
