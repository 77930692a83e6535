#include "config/loader.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/schema.h"

namespace gpt {
namespace {

// The error message of loading `text` as "x.yaml" with `overrides`; fails the test if it loads.
std::string load_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto r = load_run_config_text(text, "x.yaml", overrides);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  return r.status().message();
}

RunConfig load_ok(const std::string& text, const std::vector<std::string>& overrides = {}) {
  auto r = load_run_config_text(text, "x.yaml", overrides);
  INFO(r.status().message());
  REQUIRE(r.has_value());
  return *r;
}

TEST_CASE("Loader reads sections and records where each key came from", "[config]") {
  const RunConfig cfg = load_ok(
      "run:\n"
      "  name: tiny\n"
      "model:\n"
      "  n_layer: 2\n"
      "  n_embd:   64   # comment\n"
      "training:\n"
      "  lr: 3e-4\n"
      "  activation_checkpointing: every:2\n"
      "data:\n"
      "  tokenizer:\n");
  CHECK(cfg.run.name == "tiny");
  CHECK(cfg.model.n_layer == 2);
  CHECK(cfg.model.n_embd == 64);
  CHECK(cfg.training.lr == 3e-4f);
  CHECK(cfg.training.activation_checkpointing == "every:2");
  CHECK(cfg.model.n_head == RunConfig{}.model.n_head);
  CHECK(cfg.where("run.name") == "x.yaml:2:9");
  CHECK(cfg.where("model.n_embd") == "x.yaml:5:13");
  CHECK(cfg.where("data.tokenizer") == "x.yaml:10:3");  // a null value is placed at its key
  CHECK(cfg.where("model.n_head") == "(default)");
  CHECK(config_values_equal(load_ok(""), RunConfig{}));
  CHECK(config_values_equal(load_ok("model:\n"), RunConfig{}));
}

TEST_CASE("Overrides apply after the file, in order, and are recorded", "[config]") {
  const RunConfig cfg = load_ok(
      "model:\n  n_head: 2\n", {"model.n_head=8", "data.sampling=sequential", " run.name = 'a b' ", "model.n_head=16"});
  CHECK(cfg.model.n_head == 16);
  CHECK(cfg.data.sampling == "sequential");
  CHECK(cfg.run.name == "a b");
  CHECK(cfg.where("model.n_head") == "--set model.n_head=16");
  CHECK(cfg.where("data.sampling") == "--set data.sampling=sequential");
  // An override may repair what the file got wrong, because validation runs after overrides.
  CHECK(load_ok("training:\n  lr: -1\n", {"training.lr=0.01"}).training.lr == 0.01f);
  CHECK(load_ok("", {"data.tokenizer="}).data.tokenizer.empty());
  // run.gelu_fusion auto (the default) is full on cuda with bf16 parameters, else none; a level given is kept.
  CHECK(load_ok("").gelu_fusion() == "none");
  CHECK(load_ok("", {"run.device=cuda"}).gelu_fusion() == "none");
  CHECK(load_ok("", {"run.device=cuda", "parallel.param_dtype=bf16"}).gelu_fusion() == "full");
  CHECK(load_ok("", {"run.device=cuda", "parallel.param_dtype=bf16", "run.gelu_fusion=forward"}).gelu_fusion() ==
        "forward");
}

TEST_CASE("Loader errors name file:line:column, the key and what was expected", "[config]") {
  CHECK(load_error("model:\n  n_hed: 4\n") == "x.yaml:2:3: unknown key 'model.n_hed'; did you mean 'model.n_head'?");
  CHECK(load_error("model:\n  lr: 4\n") == "x.yaml:2:3: unknown key 'model.lr'; did you mean 'training.lr'?");
  CHECK(load_error("model:\n  zzzzzzzz: 4\n") ==
        "x.yaml:2:3: unknown key 'model.zzzzzzzz'; model keys are n_layer, n_head, n_embd, block_size, vocab_size, "
        "dropout, tied_embeddings");
  CHECK(load_error("run: {}\nmodle:\n  n_head: 4\n") == "x.yaml:2:1: unknown section 'modle'; did you mean 'model'?");
  CHECK(load_error("optimizer: {}\n") ==
        "x.yaml:1:1: unknown section 'optimizer'; sections are run, model, data, training, parallel, checkpoint, comm, "
        "logging");
  CHECK(load_error("model:\n  n_head:  four\n") == "x.yaml:2:12: model.n_head: expected an integer, got 'four'");
  CHECK(load_error("model:\n  n_head: [4]\n") ==
        "x.yaml:2:11: model.n_head: expected a single int value, got a sequence");
  CHECK(load_error("training:\n  lr: -1\n") == "x.yaml:2:7: training.lr: must be > 0, got -1");
  CHECK(load_error("data:\n  sampling: rand\n") ==
        "x.yaml:2:13: data.sampling: expected one of random|sequential, got 'rand'");
  CHECK(load_error("model:\n  dropout: 1.0\n") == "x.yaml:2:12: model.dropout: must be in [0, 1), got 1");
  CHECK(load_error("model:\n  vocab_size: 70000\n") ==
        "x.yaml:2:15: model.vocab_size: must be in [0, 65536], got 70000");
  CHECK(load_error("training:\n  beta2: 1\n") == "x.yaml:2:10: training.beta2: must be in [0, 1), got 1");
  CHECK(load_error("model: 5\n") == "x.yaml:1:8: section 'model' must be a map of key: value, got '5'");
  CHECK(load_error("- run\n") ==
        "x.yaml:1:1: expected a map of sections (run, model, data, training, parallel, checkpoint, comm, logging), got "
        "a sequence");
  CHECK(load_error("model:\n  n_head: 4\n  n_head: 8\n") ==
        "x.yaml:3:3: duplicate key 'model.n_head' (first at x.yaml:2:11)");
  CHECK(load_error("model: {}\nmodel: {}\n") == "x.yaml:2:1: duplicate section 'model' (first at x.yaml:1:1)");
  // A second document was ignored, unknown keys and all; an empty one (a trailing '---') is nothing.
  CHECK(load_error("model:\n  n_head: 2\n---\nmodel:\n  n_head: 4\n")
            .starts_with("x.yaml:4:1: a second YAML document (after '---')"));
  CHECK(load_ok("---\nmodel:\n  n_head: 2\n---\n").model.n_head == 2);
  // YAML syntax errors carry yaml-cpp's position.
  CHECK(load_error("model: [1,\ndata: c: d\n") == "x.yaml:2:8: invalid YAML: end of sequence flow not found");
}

TEST_CASE("Bad --set arguments are named with a suggestion", "[config]") {
  CHECK(load_error("", {"model.n_head"}) == "--set model.n_head: expected section.key=value, e.g. model.n_head=...");
  CHECK(load_error("", {"model.n_hed"}) ==
        "--set model.n_hed: expected section.key=value; did you mean 'model.n_head=...'?");
  CHECK(load_error("", {"=4"}) == "--set =4: expected section.key=value");
  CHECK(load_error("", {"model.n_hed=4"}) ==
        "--set model.n_hed=4: unknown key 'model.n_hed'; did you mean 'model.n_head'?");
  CHECK(load_error("", {"n_head=4"}) == "--set n_head=4: unknown key 'n_head'; did you mean 'model.n_head'?");
  CHECK(load_error("", {"model.n_head=four"}) ==
        "--set model.n_head=four: model.n_head: expected an integer, got 'four'");
  CHECK(load_error("", {"training.lr=-1"}) == "--set training.lr=-1: training.lr: must be > 0, got -1");
  CHECK(load_error("", {"run.name=[a"}).starts_with("--set run.name=[a: run.name: value is not valid YAML: "));
}

TEST_CASE("Rules across keys are checked after overrides and placed at the key to fix", "[config]") {
  CHECK(load_error("model:\n  n_head: 4\n  n_embd: 130\n") ==
        "x.yaml:3:11: model.n_embd: must be a multiple of model.n_head (4), got 130");
  CHECK(load_error("model:\n  n_head: 5\n") ==  // n_embd left at 128: placed at n_head
        "x.yaml:2:11: model.n_embd: must be a multiple of model.n_head (5), got 128");
  CHECK(load_error("", {"model.n_head=3"}) ==
        "--set model.n_head=3: model.n_embd: must be a multiple of model.n_head (3), got 128");
  CHECK(load_error("training:\n  micro_batch_size: 4\n  global_batch_sequences: 10\n") ==
        "x.yaml:3:27: training.global_batch_sequences: must be a multiple of training.micro_batch_size (4), got 10");
  CHECK(load_error("training:\n  micro_batch_size: 4\n  global_batch_tokens: 1000\n") ==
        "x.yaml:3:24: training.global_batch_tokens: must be a multiple of model.block_size * "
        "training.micro_batch_size (64 * 4 = 256), got 1000");
  CHECK(load_error("training:\n  global_batch_sequences: 24\n  global_batch_tokens: 1536\n") ==
        "x.yaml:3:24: training.global_batch_tokens: cannot be set together with training.global_batch_sequences; "
        "set one");
  CHECK(load_error("training:\n  lr: 0.001\n  min_lr: 0.01\n") ==
        "x.yaml:3:11: training.min_lr: must be <= training.lr (0.001), got 0.01");
  CHECK(load_error("training:\n  activation_checkpointing: every:0\n") ==
        "x.yaml:2:29: training.activation_checkpointing: expected one of none|full|selective|every:N with N >= 1, "
        "got 'every:0'");
  CHECK(load_error("run:\n  gelu_fusion: full\n") ==
        "x.yaml:2:16: run.gelu_fusion: full fuses the GELU into bf16 cuBLASLt GEMMs; it needs run.device: cuda and "
        "parallel.param_dtype: bf16, got run.device: cpu, parallel.param_dtype: fp32");
  CHECK(load_error("run:\n  gelu_fusion: fused\n") ==
        "x.yaml:2:16: run.gelu_fusion: expected one of auto|none|forward|full, got 'fused'");
  CHECK(load_error("run:\n  attention_kernel: wmma\n") ==
        "x.yaml:2:21: run.attention_kernel: wmma chooses between bf16 tensor-core kernels; it needs run.device: cuda "
        "and parallel.param_dtype: bf16, got run.device: cpu, parallel.param_dtype: fp32");
  CHECK(load_error("run:\n  attention_kernel: flash\n") ==
        "x.yaml:2:21: run.attention_kernel: expected one of auto|wmma, got 'flash'");
}

TEST_CASE("global_batch comes from sequences, else tokens, else the micro-batch", "[config]") {
  RunConfig cfg = load_ok("training:\n  micro_batch_size: 4\n");
  CHECK(cfg.global_batch() == 4);
  CHECK(cfg.grad_accum_steps() == 1);
  cfg = load_ok("training:\n  micro_batch_size: 4\n  global_batch_sequences: 32\n");
  CHECK(cfg.global_batch() == 32);
  CHECK(cfg.grad_accum_steps() == 8);
  cfg = load_ok("model:\n  block_size: 128\ntraining:\n  micro_batch_size: 4\n  global_batch_tokens: 4096\n");
  CHECK(cfg.global_batch() == 32);
  CHECK(cfg.grad_accum_steps() == 8);
}

TEST_CASE("to_yaml writes every key and reads back to the same config", "[config]") {
  const std::string defaults_yaml = to_yaml(RunConfig{});
  for (const KeySpec& s : config_schema()) {
    CHECK(defaults_yaml.find("\n  " + std::string(s.name) + ": ") != std::string::npos);
  }
  CHECK(config_values_equal(load_ok(defaults_yaml), RunConfig{}));

  const RunConfig cfg =
      load_ok("", {"run.name=\"true\"", "run.out_dir=\"dir with: colon # and hash\"", "run.seed=18446744073709551615",
                   "data.tokenizer=", "data.val=\"q\\\"uote\\tx\"", "model.dropout=0.1", "training.lr=3e-4",
                   "training.min_lr=0.00003", "training.eps=1e-10", "training.activation_checkpointing=every:3",
                   "training.global_batch_tokens=1536", "logging.level=debug"});
  CHECK(cfg.data.val == "q\"uote\tx");
  const RunConfig back = load_ok(to_yaml(cfg));
  CHECK(config_values_equal(cfg, back));
  CHECK(back.run.name == "true");
  CHECK(back.run.seed == 18446744073709551615ull);
  CHECK(back.training.eps == 1e-10f);
  CHECK(to_yaml(back) == to_yaml(cfg));
}

TEST_CASE("Loading a file: positions use the path, a missing file is named", "[config]") {
  const auto dir = std::filesystem::temp_directory_path() / "gpt_config_test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "run.yaml").string();
  std::ofstream(path) << "model:\n  n_head: 8\n";
  auto r = load_run_config_file(path, {"training.steps=10", "training.warmup_steps=5"});
  REQUIRE(r.has_value());
  CHECK(r->model.n_head == 8);
  CHECK(r->training.steps == 10);
  CHECK(r->where("model.n_head") == path + ":2:11");

  auto missing = load_run_config_file((dir / "nope.yaml").string(), {});
  REQUIRE_FALSE(missing.has_value());
  CHECK(missing.status().message() ==
        "cannot open config file '" + (dir / "nope.yaml").string() + "': No such file or directory");
  auto directory = load_run_config_file(dir.string(), {});
  REQUIRE_FALSE(directory.has_value());
  CHECK(directory.status().message() == "cannot open config file '" + dir.string() + "': Is a directory");
  for (const char* text : {"", "\n  \n", "# a comment\n---\n", "\xef\xbb\xbf# a BOM and a comment\n"}) {  // no keys
    std::ofstream(path, std::ios::trunc) << text;
    auto empty = load_run_config_file(path, {});
    REQUIRE_FALSE(empty.has_value());
    CHECK(empty.status().message().find(path + ": the config file holds no keys") != std::string::npos);
  }
  std::ofstream(path, std::ios::trunc) << "--- {training: {steps: 5}}\n";  // a document on its start line
  auto one_line = load_run_config_file(path, {});
  REQUIRE(one_line.has_value());
  CHECK(one_line->training.steps == 5);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gpt
