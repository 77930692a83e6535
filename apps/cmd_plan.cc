// `gpt-train plan`: what a run config needs per rank under every strategy (memory by category and
// communication per step) and the strategy `auto` would pick, without allocating or reading data (the one
// file read besides the config is the tokenizer below). A config whose model.vocab_size is 0 (taken from the data
// at train time) is planned with --vocab-size, else the size of the tokenizer train would take where it is found,
// else GPT-2's 50257, an upper bound for the tokenizers we ship; a printed note says which.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "apps/commands.h"
#include "comm/communicator.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "plan/planner.h"
#include "plan/report.h"

namespace gpt {

namespace {

constexpr int kDefaultVocab = 50257;  // GPT-2 BPE

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  int world_size = 1;
  int ranks_per_node = 0;  // 0 = world_size (one node)
  double device_memory_gb = 0;
  double gpu_free_gb = 0;
  int vocab_size = 0;
};

}  // namespace

// A finite number > 0 (CLI11's PositiveNumber lets "nan" and "inf" through).
const CLI::Validator kFinitePositive(
    [](const std::string& text) -> std::string {
      double v = 0;
      if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v <= 0) {
        return "expected a finite number > 0, got '" + text + "'";
      }
      return "";
    },
    "POSITIVE");

Command add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  app.add_option("--config,-c", args->config, "YAML run config (default: the built-in configs/quickstart.yaml)");
  app.add_option("--set", args->overrides, "Override a config key, e.g. --set training.micro_batch_size=4 (repeatable)")
      ->type_name("KEY=VALUE");
  app.add_option("--world-size,-n", args->world_size, "Ranks in the data-parallel group")
      ->required()
      ->check(CLI::Range(1, 1 << 24));  // not PositiveNumber: its message prints DBL_MAX in full
  app.add_option("--ranks-per-node", args->ranks_per_node,
                 "Ranks sharing one node: the per-node total, and hybrid's shard group unless "
                 "parallel.shard_group_size is set (default: all on one node)")
      ->check(CLI::Range(1, 1 << 24));  // not PositiveNumber: its message prints DBL_MAX in full
  app.add_option("--device-memory-gb", args->device_memory_gb,
                 "Memory per rank in GB (1e9 bytes) for choosing `auto` (default: unlimited)")
      ->check(kFinitePositive);
  app.add_option("--gpu-free-gb", args->gpu_free_gb,
                 "Free memory per GPU in GB (1e9 bytes) at the start, as a cuda training run measures it: `auto` "
                 "picks within it less parallel.device_memory_reserve_gb (and --device-memory-gb if smaller), and "
                 "the configured strategy is checked against that as train does (exit 2 if it does not fit)")
      ->check(kFinitePositive);
  app.add_option("--vocab-size", args->vocab_size,
                 "Vocabulary size when the config's model.vocab_size is 0 (default: the size of the tokenizer training "
                 "would take, data.tokenizer or tokenizer.json beside data.train, else 50257, GPT-2's)")
      ->check(CLI::Range(1, 65536));  // as model.vocab_size: token ids are uint16 in the shards
  app.footer(
      "Prints bytes per rank for params, grads, master weights, optimizer state, activations, workspace and\n"
      "comm buffers, and elements/bytes communicated per step, for single (world size 1), ddp, zero1, zero2,\n"
      "zero3 and, when the ranks span several nodes, hybrid zero2/zero3 (shard groups of --ranks-per-node or\n"
      "parallel.shard_group_size); then the strategy `auto` picks (least communication that fits) and why,\n"
      "and with --gpu-free-gb whether the configured strategy fits on the GPU as a cuda run checks it.\n"
      "The parallel.* keys (param_dtype, reduce_dtype, prefetch, reshard_after_forward) apply to every column.\n"
      "Examples:\n"
      "  gpt-train plan --config configs/gpt2-124m.yaml --world-size 8 --device-memory-gb 80\n"
      "  gpt-train plan -c configs/gpt2-1.5b.yaml -n 32 --ranks-per-node 8 --device-memory-gb 40 \\\n"
      "      --set training.activation_checkpointing=full --set parallel.param_dtype=bf16\n"
      "  gpt-train plan -c configs/shakespeare-char-cpu.yaml -n 1 --vocab-size 65 --device-memory-gb 2\n"
      "  gpt-train plan -c configs/gpt2-124m.yaml -n 8 --set parallel.strategy=auto --gpu-free-gb 139");
  return [args]() -> int {
    Expected<RunConfig> cfg = load_config_arg(args->config, args->overrides);
    if (!cfg) return report_error(cfg.status());
    const bool print = world().rank() == 0;
    GptShape shape;
    shape.n_layer = cfg->model.n_layer;
    shape.n_head = cfg->model.n_head;
    shape.n_embd = cfg->model.n_embd;
    shape.block_size = cfg->model.block_size;
    shape.vocab_size = cfg->model.vocab_size;
    shape.dropout = cfg->model.dropout;
    // model.vocab_size 0: the data's tokenizer decides when training. Where it is found as train looks for it
    // (data.tokenizer, else tokenizer.json beside data.train's first shard) the plan takes its size too.
    std::string tokenizer_path = cfg->data.tokenizer;
    if (tokenizer_path.empty()) {
      auto shards = data::expand_pattern(cfg->data.train);  // a path not there yet is taken as it reads
      const std::string first = shards && !shards->empty() ? shards->front() : cfg->data.train;
      tokenizer_path = (std::filesystem::path(first).parent_path() / "tokenizer.json").string();
    }
    std::error_code ec;
    if (args->vocab_size == 0 && shape.vocab_size == 0 && !cfg->data.tokenizer.empty() &&
        !std::filesystem::exists(cfg->data.tokenizer, ec)) {  // the size would come from it
      return report_error(Status::not_found(cfg->where("data.tokenizer") + ": data.tokenizer " + cfg->data.tokenizer +
                                            " is not there (train would stop here too)"));
    }
    std::optional<data::Tokenizer> tokenizer;
    if (args->vocab_size == 0 && shape.vocab_size == 0 && std::filesystem::exists(tokenizer_path, ec)) {
      auto loaded = data::Tokenizer::load(tokenizer_path);
      if (!loaded) return report_error(loaded.status().with_context("the tokenizer for model.vocab_size 0"));
      tokenizer.emplace(std::move(*loaded));
    }
    if (args->vocab_size > 0) {
      shape.vocab_size = args->vocab_size;
    } else if (shape.vocab_size == 0 && tokenizer) {
      shape.vocab_size = tokenizer->vocab_size();
      if (print) {
        std::cout << "note: model.vocab_size is 0: planning with " << shape.vocab_size << ", the symbols of "
                  << tokenizer_path << " (as training takes it)\n";
      }
    } else if (shape.vocab_size == 0) {
      shape.vocab_size = kDefaultVocab;
      if (print) {
        std::cout << "note: " << cfg->where("model.vocab_size")
                  << ": model.vocab_size is 0 (taken from the data's tokenizer when training, or its largest id + 1 "
                     "without one); planning with "
                  << kDefaultVocab << " (GPT-2 BPE); pass --vocab-size N for your data's\n";
      }
    }
    auto planned =
        plan_input(*cfg, shape, args->world_size, args->ranks_per_node > 0 ? args->ranks_per_node : args->world_size);
    if (!planned) return report_error(planned.status());
    PlanInput in = *planned;
    // Show the configured hybrid whatever the strategy (under hybrid, plan_input has its shard group size, the
    // ranks per node where parallel.shard_group_size is 0).
    if (cfg->parallel.strategy != "hybrid") in.shard_group_size = cfg->parallel.shard_group_size;
    if (Status st = check_plan_input(in); !st.is_ok()) return report_error(st);

    const std::vector<StrategyPlan> plans = plan_all(in);
    if (print) std::cout << plan_report(in, plans) << "\n";
    std::optional<DeviceBudget> budget;
    if (args->gpu_free_gb > 0) {
      budget = DeviceBudget{std::llround(args->gpu_free_gb * 1e9), 0, device_memory_reserve_bytes(cfg->parallel),
                            "each GPU (--gpu-free-gb)"};
    }
    // The memory `auto` fits: --device-memory-gb, else the config's parallel.device_memory_gb, as train reads it.
    const bool flag_memory = args->device_memory_gb > 0;
    const double memory_gb = flag_memory ? args->device_memory_gb : cfg->parallel.device_memory_gb;
    Expected<AutoChoice> choice = choose_auto(plans, memory_gb, budget);
    if (!choice) {
      return report_error(choice.status().with_context(flag_memory ? std::string("--device-memory-gb")
                                                                   : cfg->where("parallel.device_memory_gb") +
                                                                         ": parallel.device_memory_gb"));
    }
    if (print) {
      std::cout << "auto: " << strategy_name(choice->strategy) << ": " << choice->reason << "\n";
      const std::string where = cfg->where("parallel.strategy");
      std::cout << "config: parallel.strategy is " << cfg->parallel.strategy
                << (cfg->parallel.strategy == "hybrid" ? " of " + cfg->parallel.hybrid_inner : std::string()) << " "
                << (where == "(default)" ? where : "(" + where + ")") << "\n";
    }
    const bool hybrid = cfg->parallel.strategy == "hybrid";
    Strategy strategy = choice->strategy;
    if (cfg->parallel.strategy != "auto") {
      auto parsed = parse_strategy(hybrid ? cfg->parallel.hybrid_inner : cfg->parallel.strategy);
      if (!parsed) return report_error(parsed.status());
      strategy = *parsed;
    }
    if (strategy == Strategy::kSingle && args->world_size > 1) {  // as train refuses it (after the report)
      return report_error(Status::invalid_argument(
          cfg->where("parallel.strategy") + ": parallel.strategy: single runs on one process, but the plan is for " +
          std::to_string(args->world_size) + " ranks; choose auto (" + std::string(strategy_name(choice->strategy)) +
          " here), ddp, zero1, zero2, zero3 or hybrid"));
    }
    if (!budget) return 0;
    // The configured strategy against the GPU, as train checks it at its start.
    // Hybrid with one shard group of the whole world runs as plain zero2/zero3, and is checked so.
    const Expected<const StrategyPlan*> plan =
        find_run_plan(plans, strategy, hybrid ? in.shard_group_size : args->world_size, args->world_size);
    if (!plan) return report_error(plan.status());
    if (Status st = check_plan_fits(**plan, plans, *budget); !st.is_ok()) {
      return report_error(st.with_context(fmt::format("--gpu-free-gb {:g}", args->gpu_free_gb)));
    }
    if (print) {
      std::cout << "fit: " << (*plan)->name() << " needs " << format_bytes((*plan)->total) << " per rank, within "
                << budget->describe() << "\n";
    }
    return 0;
  };
}

}  // namespace gpt
