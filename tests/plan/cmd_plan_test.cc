// End-to-end: `gpt-train plan` on the shipped GPT-2 124M config prints every strategy's table and the
// choice of `auto`; bad input ends in a clear message and exit code 2.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "testing/run_command.h"
#include "testing/temp_dir.h"

namespace gpt {
namespace {

using testing::gpt_train;
using testing::run_command;

const std::string kConfig = std::string(GPT_SOURCE_DIR) + "/configs/gpt2-124m.yaml";

TEST_CASE("gpt-train plan prints every strategy and what auto picks", "[plan]") {
  const auto r = run_command(gpt_train() + " plan --config " + kConfig + " --world-size 8 --device-memory-gb 80");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const char* word :
       {"ddp", "zero1", "zero2", "zero3", "params", "grads", "master", "optimizer", "activations", "comm buffers",
        "total", "all-reduce", "reduce-scatter", "all-gather", "124.44M parameters", "4 per rank per step", "auto: "}) {
    INFO(word);
    CHECK(r.output.find(word) != std::string::npos);
  }
  // `single` only at world size 1.
  const size_t header = r.output.find("memory per rank");
  REQUIRE(header != std::string::npos);
  CHECK(r.output.substr(header, r.output.find('\n', header) - header).find("single") == std::string::npos);
}

TEST_CASE("gpt-train plan --gpu-free-gb: auto within the GPU less the reserve, and the strategy checked as train does",
          "[plan]") {
  // GPT-2 124M at 8 ranks as shipped: ddp plans 8.37 GiB (8.99 GB), zero1 7.21 GiB (7.74 GB), zero3 6.90 GiB.
  const std::string base = gpt_train() + " plan -c " + kConfig + " -n 8 --set parallel.device_memory_reserve_gb=0.5";
  const auto fits = run_command(base + " --set parallel.strategy=zero3 --gpu-free-gb 80");
  INFO(fits.output);
  REQUIRE(fits.exit_code == 0);
  CHECK(fits.output.find("auto: ddp: ddp needs ") != std::string::npos);
  CHECK(fits.output.find("fit: zero3 needs ") != std::string::npos);
  CHECK(fits.output.find("within the 74.51 GiB free on each GPU (--gpu-free-gb) less "
                         "parallel.device_memory_reserve_gb (476.8 MiB)") != std::string::npos);
  // 9 GB less 0.5: too little for ddp, so auto moves to zero1, and ddp asked for by name is refused, exit 2.
  const auto tight = run_command(base + " --set parallel.strategy=ddp --gpu-free-gb 9");
  INFO(tight.output);
  CHECK(tight.exit_code == 2);
  CHECK(tight.output.find("auto: zero1: zero1 needs ") != std::string::npos);
  CHECK(tight.output.find("--gpu-free-gb 9: ddp needs ") != std::string::npos);
  CHECK(tight.output.find("none of its buffers was allocated") != std::string::npos);
  CHECK(tight.output.find("zero3 (") != std::string::npos);
  // --device-memory-gb narrows auto's choice below the GPU's (zero2 plans 7.00 GiB, 7.52 GB), never widens it.
  const auto given = run_command(base + " --set parallel.strategy=zero3 --gpu-free-gb 80 --device-memory-gb 7.6");
  INFO(given.output);
  CHECK(given.exit_code == 0);
  CHECK(given.output.find("auto: zero2") != std::string::npos);
  const auto wide = run_command(base + " --set parallel.strategy=zero3 --gpu-free-gb 9 --device-memory-gb 100");
  INFO(wide.output);
  CHECK(wide.exit_code == 0);
  CHECK(wide.output.find("auto: zero1") != std::string::npos);
  // Hybrid is checked against the plan train follows: one rank per node makes shard groups of one, and one node of
  // all the ranks is a single shard group, plain zero3.
  const std::string hybrid =
      base + " --set parallel.strategy=hybrid --set parallel.hybrid_inner=zero3 --gpu-free-gb 80";
  const auto apart = run_command(hybrid + " --ranks-per-node 1");
  INFO(apart.output);
  CHECK(apart.exit_code == 0);
  CHECK(apart.output.find("shard groups of 1 rank,") != std::string::npos);
  CHECK(apart.output.find("fit: hybrid-zero3 needs ") != std::string::npos);
  const auto together = run_command(hybrid + " --ranks-per-node 8");
  INFO(together.output);
  CHECK(together.exit_code == 0);
  CHECK(together.output.find("fit: zero3 needs ") != std::string::npos);
  const auto uneven = run_command(hybrid + " --ranks-per-node 3");
  INFO(uneven.output);
  CHECK(uneven.exit_code == 2);
  CHECK(uneven.output.find("a shard group of 3 ranks (parallel.shard_group_size 0: the ranks per node) does not "
                           "divide the 8 ranks of this job") != std::string::npos);
  // single at 8 ranks is refused as train refuses it, naming what to choose (not "no plan ... a bug").
  const auto single = run_command(base + " --set parallel.strategy=single --gpu-free-gb 80");
  INFO(single.output);
  CHECK(single.exit_code == 2);
  CHECK(single.output.find("single runs on one process, but the plan is for 8 ranks; choose auto (ddp here)") !=
        std::string::npos);
  CHECK(single.output.find("a bug") == std::string::npos);
}

TEST_CASE("gpt-train plan: one rank, overrides, unknown vocabulary, nothing fits", "[plan]") {
  SECTION("world size 1 adds single, and auto picks it") {
    const auto r = run_command(gpt_train() + " plan -c " + kConfig +
                               " -n 1 --set training.micro_batch_size=4 --set training.activation_checkpointing=full");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("activation checkpointing: full") != std::string::npos);
    CHECK(r.output.find("auto: single") != std::string::npos);
  }
  SECTION("vocab_size 0 plans with 50257 and says so") {
    testing::TempDir dir;
    const std::string cfg = dir.write("c.yaml",
                                      "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16}\n"
                                      "training: {micro_batch_size: 2, global_batch_sequences: 8}\n");
    const auto r = run_command(gpt_train() + " plan -c " + cfg + " -n 2");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("note: ") != std::string::npos);
    CHECK(r.output.find("vocab 50257") != std::string::npos);
    const auto v = run_command(gpt_train() + " plan -c " + cfg + " -n 2 --vocab-size 65");
    CHECK(v.exit_code == 0);
    CHECK(v.output.find("vocab 65") != std::string::npos);
    CHECK(v.output.find("note: ") == std::string::npos);
    // A small model's config whose data.train is `train` (model.vocab_size 0: taken from the data).
    const auto config_with_train = [&](const std::string& name, const std::string& train) {
      return dir.write(name, "data: {train: '" + train +
                                 "'}\nmodel: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16}\n"
                                 "training: {micro_batch_size: 2, global_batch_sequences: 8}\n");
    };
    // A tokenizer where training would find it (beside data.train's shards): its size.
    std::filesystem::create_directories(dir.file("data"));
    dir.write("data/tokenizer.json", R"({"type":"char","vocab":["a","b","c"]})");
    const std::string beside = config_with_train("b.yaml", dir.file("data/train.bin"));
    const auto t = run_command(gpt_train() + " plan -c " + beside + " -n 2");
    INFO(t.output);
    CHECK(t.exit_code == 0);
    CHECK(t.output.find("vocab 3") != std::string::npos);
    CHECK(t.output.find("planning with 3, the symbols of " + dir.file("data/tokenizer.json")) != std::string::npos);
    // data.train as a glob: beside its first match, as training looks.
    std::filesystem::create_directories(dir.file("sharded"));
    dir.write("sharded/train_000001.bin", "");
    dir.write("sharded/tokenizer.json", R"({"type":"char","vocab":["a","b","c","d"]})");
    const std::string glob = config_with_train("g.yaml", dir.file("sharded/train_*.bin"));
    const auto g = run_command(gpt_train() + " plan -c " + glob + " -n 2");
    INFO(g.output);
    CHECK(g.exit_code == 0);
    CHECK(g.output.find("planning with 4, the symbols of " + dir.file("sharded/tokenizer.json")) != std::string::npos);
    // data.tokenizer naming GPT-2's BPE files as Hugging Face publishes them (a directory).
    const std::string bpe = std::string(GPT_SOURCE_DIR) + "/tests/fixtures/bpe";
    const auto h = run_command(gpt_train() + " plan -c " + glob + " -n 2 --set data.tokenizer=" + bpe);
    INFO(h.output);
    CHECK(h.exit_code == 0);
    CHECK(h.output.find("planning with 857, the symbols of " + bpe) != std::string::npos);
    const auto none = run_command(gpt_train() + " plan -c " + glob + " -n 2 --set data.tokenizer=" + dir.file("nope"));
    CHECK(none.exit_code == 2);
    CHECK(none.output.find("data.tokenizer " + dir.file("nope") + " is not there") != std::string::npos);
  }
  SECTION("several nodes add hybrid plans; parallel.* keys apply") {
    const auto r = run_command(gpt_train() + " plan -c " + kConfig +
                               " -n 16 --ranks-per-node 8 --set parallel.param_dtype=bf16 --set parallel.prefetch=2");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("hybrid-zero2") != std::string::npos);
    CHECK(r.output.find("hybrid-zero3") != std::string::npos);
    CHECK(r.output.find("shard groups of 8 ranks") != std::string::npos);
    CHECK(r.output.find("param_dtype bf16") != std::string::npos);
    CHECK(r.output.find("prefetch 2") != std::string::npos);
  }
  SECTION("run.device cuda: the backend's workspaces; gelu_fusion full: the same memory as none") {
    const std::string cuda =
        gpt_train() + " plan -c " + kConfig + " -n 8 --set run.device=cuda --set parallel.param_dtype=bf16";
    auto workspace_row = [](const std::string& out) {
      const size_t at = out.find("\n  workspace");
      REQUIRE(at != std::string::npos);
      return out.substr(at + 1, out.find('\n', at + 1) - at - 1);
    };
    const auto none = run_command(cuda + " --set run.gelu_fusion=none");
    INFO(none.output);
    REQUIRE(none.exit_code == 0);
    CHECK(none.output.find("device: cuda (fused attention") != std::string::npos);
    CHECK(none.output.find("gelu_fusion") == std::string::npos);
    // auto, the default, is full on cuda with bf16 parameters.
    for (const std::string& set : {std::string(" --set run.gelu_fusion=full"), std::string()}) {
      const auto full = run_command(cuda + set);
      INFO(full.output);
      REQUIRE(full.exit_code == 0);
      CHECK(full.output.find("gelu_fusion full (the GELU backward in the projection GEMM's epilogue)") !=
            std::string::npos);
      CHECK(workspace_row(full.output) == workspace_row(none.output));
    }
    // Unfused, the GELU backward runs in place on the bf16 gradient at its output; fused, its bf16 input gradient
    // comes from the GEMM instead: one bf16 (N, 4C) area either way (checked in the loop above).
    const auto cpu = run_command(gpt_train() + " plan -c " + kConfig + " -n 8 --set run.device=cpu");
    CHECK(cpu.output.find("device: cpu\n") != std::string::npos);
  }
  SECTION("a batch that does not split over the ranks") {
    const auto r = run_command(gpt_train() + " plan -c " + kConfig + " -n 3");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("must split evenly over 3 ranks") != std::string::npos);
    CHECK(r.output.find("a global batch of 528 sequences would (3 x 16 x gradient accumulation steps)") !=
          std::string::npos);                                                       // 512 is not a multiple of 3 x 16
    const auto wide = run_command(gpt_train() + " plan -c " + kConfig + " -n 64");  // 8 sequences per rank
    INFO(wide.output);
    CHECK(wide.exit_code == 2);
    CHECK(wide.output.find("training.micro_batch_size 8 divides each rank's 8 sequences") != std::string::npos);
  }
  SECTION("nothing fits") {
    const auto r = run_command(gpt_train() + " plan -c " + kConfig + " -n 8 --device-memory-gb 0.5");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("zero3") != std::string::npos);
    CHECK(r.output.find("no strategy fits in 0.5 GB per rank") != std::string::npos);
    // The config's parallel.device_memory_gb, as train reads it (plan ignored it), named as the source.
    const auto key = run_command(gpt_train() + " plan -c " + kConfig + " -n 8 --set parallel.device_memory_gb=0.5");
    INFO(key.output);
    CHECK(key.exit_code == 2);
    CHECK(key.output.find("parallel.device_memory_gb: no strategy fits in 0.5 GB per rank") != std::string::npos);
  }
  SECTION("--help has examples") {
    const auto r = run_command(gpt_train() + " plan --help");
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("Examples:") != std::string::npos);
    CHECK(r.output.find("--world-size") != std::string::npos);
  }
}

}  // namespace
}  // namespace gpt
