#include "config/schema.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>
#include <vector>

#include "config/validate.h"

namespace gpt {
namespace {

const std::vector<std::string> kExpectedKeys = {"run.name",
                                                "run.out_dir",
                                                "run.seed",
                                                "run.threads",
                                                "run.device",
                                                "run.gelu_fusion",
                                                "run.attention_kernel",
                                                "model.n_layer",
                                                "model.n_head",
                                                "model.n_embd",
                                                "model.block_size",
                                                "model.vocab_size",
                                                "model.dropout",
                                                "model.tied_embeddings",
                                                "data.train",
                                                "data.val",
                                                "data.tokenizer",
                                                "data.sampling",
                                                "training.steps",
                                                "training.micro_batch_size",
                                                "training.global_batch_sequences",
                                                "training.global_batch_tokens",
                                                "training.lr",
                                                "training.min_lr",
                                                "training.warmup_steps",
                                                "training.lr_schedule",
                                                "training.decay_steps",
                                                "training.beta1",
                                                "training.beta2",
                                                "training.eps",
                                                "training.weight_decay",
                                                "training.grad_clip",
                                                "training.eval_interval",
                                                "training.eval_batches",
                                                "training.activation_checkpointing",
                                                "training.nonfinite",
                                                "parallel.strategy",
                                                "parallel.device_memory_gb",
                                                "parallel.device_memory_reserve_gb",
                                                "parallel.shard_group_size",
                                                "parallel.hybrid_inner",
                                                "parallel.prefetch",
                                                "parallel.param_dtype",
                                                "parallel.reduce_dtype",
                                                "parallel.stochastic_rounding",
                                                "parallel.reshard_after_forward",
                                                "parallel.bucket_mb",
                                                "checkpoint.every",
                                                "checkpoint.keep_last",
                                                "checkpoint.dir",
                                                "checkpoint.async",
                                                "checkpoint.resume",
                                                "checkpoint.init_from",
                                                "comm.timeout_s",
                                                "comm.save_timeout_s",
                                                "logging.level",
                                                "logging.log_interval",
                                                "logging.metrics_file",
                                                "logging.peak_tflops"};

std::string error_of(Status st) {
  REQUIRE_FALSE(st.is_ok());
  CHECK(st.code() == StatusCode::kInvalidArgument);
  return st.message();
}

TEST_CASE("Schema lists every RunConfig key once, each with its own field", "[config]") {
  std::vector<std::string> keys;
  std::set<const void*> fields;
  RunConfig cfg;
  for (const KeySpec& s : config_schema()) {
    keys.emplace_back(s.key);
    CHECK(std::string(s.key) == std::string(s.section) + "." + std::string(s.name));
    CHECK_FALSE(s.meaning.empty());
    CHECK_FALSE(section_meaning(s.section).empty());
    fields.insert(std::visit([](auto* p) -> const void* { return p; }, s.field(cfg)));
    CHECK(find_config_key(s.key) == &s);
  }
  CHECK(keys == kExpectedKeys);
  CHECK(fields.size() == keys.size());
  CHECK(find_config_key("model.n_hed") == nullptr);
}

TEST_CASE("Schema defaults are RunConfig{}'s, valid, and read back to themselves", "[config]") {
  const RunConfig defaults;
  REQUIRE(validate_run_config(defaults, "<defaults>").is_ok());
  const KeySpec& n_head = *find_config_key("model.n_head");
  CHECK(format_value(n_head, defaults) == std::to_string(defaults.model.n_head));
  CHECK(format_value(*find_config_key("training.lr"), defaults) == "0.001");
  CHECK(format_value(*find_config_key("model.tied_embeddings"), defaults) == "true");
  for (const KeySpec& s : config_schema()) {
    RunConfig other;
    // Move every field off its default first, so reading the default text back must restore it.
    std::visit(
        [](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, bool>)
            *p = !*p;
          else if constexpr (std::is_same_v<T, std::string>)
            *p += "x";
          else
            *p = *p + 1;
        },
        s.field(other));
    REQUIRE_FALSE(config_values_equal(defaults, other));
    REQUIRE(parse_value(s, format_value(s, defaults), &other).is_ok());
    CHECK(config_values_equal(defaults, other));
  }
}

TEST_CASE("Reference text names every section and key with type, default and meaning", "[config]") {
  const std::string text = config_reference_text();
  const RunConfig defaults;
  for (std::string_view section : config_sections()) {
    std::string heading = "\n";  // appended piecewise: GCC 12 warns falsely (-Wrestrict) on "\n" + s + ":"
    heading.append(section).append(":");
    CHECK(text.find(heading) != std::string::npos);
  }
  for (const KeySpec& s : config_schema()) {
    std::string def = format_value(s, defaults);
    if (type_name(s) == "string") def = "\"" + def + "\"";
    INFO(s.key);
    CHECK(text.find("  " + std::string(s.name) + " = " + def + "  (" + std::string(type_name(s))) != std::string::npos);
    CHECK(text.find(std::string(s.meaning)) != std::string::npos);
  }
  CHECK(text.find("n_head = 4  (int, >= 1)") != std::string::npos);
  CHECK(text.find("sampling = \"random\"  (string, random|sequential)") != std::string::npos);
}

TEST_CASE("parse_value checks the type and names the key", "[config]") {
  RunConfig cfg;
  auto parse = [&](const char* key, std::optional<std::string_view> text) {
    return parse_value(*find_config_key(key), text, &cfg);
  };
  CHECK(error_of(parse("model.n_head", "four")) == "model.n_head: expected an integer, got 'four'");
  CHECK(error_of(parse("model.n_head", "4.0")) == "model.n_head: expected an integer, got '4.0'");
  CHECK(error_of(parse("model.n_head", "99999999999")) ==
        "model.n_head: integer out of range for int, got '99999999999'");
  CHECK(error_of(parse("run.seed", "-1")) == "run.seed: expected a non-negative integer, got '-1'");
  CHECK(error_of(parse("training.lr", "fast")) == "training.lr: expected a finite number, got 'fast'");
  CHECK(error_of(parse("training.lr", "1e99")) == "training.lr: expected a number within float range, got '1e99'");
  CHECK(error_of(parse("model.tied_embeddings", "yes")) == "model.tied_embeddings: expected true or false, got 'yes'");
  CHECK(error_of(parse("model.n_head", std::nullopt)) ==
        "model.n_head: expected a value of type int, got nothing (null)");
  REQUIRE(parse("model.n_head", "+8").is_ok());
  CHECK(cfg.model.n_head == 8);
  REQUIRE(parse("training.lr", "3e-4").is_ok());
  CHECK(cfg.training.lr == 3e-4f);
  REQUIRE(parse("training.steps", "5000000000").is_ok());
  CHECK(cfg.training.steps == 5000000000);
  REQUIRE(parse("data.tokenizer", std::nullopt).is_ok());
  CHECK(cfg.data.tokenizer.empty());
}

TEST_CASE("check_allowed states the range and the value", "[config]") {
  RunConfig cfg;
  auto check = [&](const char* key) { return check_allowed(*find_config_key(key), cfg); };
  cfg.training.lr = -1;
  CHECK(error_of(check("training.lr")) == "training.lr: must be > 0, got -1");
  cfg.model.n_layer = 0;
  CHECK(error_of(check("model.n_layer")) == "model.n_layer: must be >= 1, got 0");
  cfg.model.dropout = 1;
  CHECK(error_of(check("model.dropout")) == "model.dropout: must be in [0, 1), got 1");
  cfg.model.vocab_size = 65537;
  CHECK(error_of(check("model.vocab_size")) == "model.vocab_size: must be in [0, 65536], got 65537");
  cfg.model.vocab_size = 65536;
  CHECK(check("model.vocab_size").is_ok());
  cfg.data.sampling = "rand";
  CHECK(error_of(check("data.sampling")) == "data.sampling: expected one of random|sequential, got 'rand'");
  cfg.run.name = "";
  CHECK(error_of(check("run.name")) == "run.name: must not be empty");
  cfg.model.tied_embeddings = false;
  CHECK(error_of(check("model.tied_embeddings")).starts_with("model.tied_embeddings: false is not supported yet"));
  for (const char* ok : {"none", "full", "selective", "every:1", "every:12"}) {
    cfg.training.activation_checkpointing = ok;
    CHECK(check("training.activation_checkpointing").is_ok());
  }
  for (const char* bad : {"every:0", "every:", "every:x", "every:2x", "some"}) {
    cfg.training.activation_checkpointing = bad;
    CHECK(error_of(check("training.activation_checkpointing")) ==
          std::string("training.activation_checkpointing: expected one of none|full|selective|every:N with N >= 1, "
                      "got '") +
              bad + "'");
  }
}

TEST_CASE("Suggestions for unknown keys and sections", "[config]") {
  CHECK(suggest_config_key("model.n_hed") == "model.n_head");
  CHECK(suggest_config_key("model.layers") == "model.n_layer");
  CHECK(suggest_config_key("model.lr") == "training.lr");
  CHECK(suggest_config_key("n_embd") == "model.n_embd");
  CHECK(suggest_config_key("training.micro_batch") == "training.micro_batch_size");
  CHECK(suggest_config_key("model.completely_different") == "");
  CHECK(suggest_config_section("modle") == "model");
  CHECK(suggest_config_section("train") == "training");
  CHECK(suggest_config_section("optimizer") == "");
}

}  // namespace
}  // namespace gpt
