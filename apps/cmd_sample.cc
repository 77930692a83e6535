#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <filesystem>
#include <iostream>
#include <memory>

#include "apps/commands.h"
#include "checkpoint/checkpoint_writer.h"
#include "train/sampler.h"

namespace gpt {

namespace {
struct SampleArgs {
  SampleOptions opts;
  std::string run_dir;
  std::string checkpoint_dir;
  std::string prompt_ids;  // "15496,11", parsed strictly (CLI11's list read "" as 0 and skipped empty entries)
};

// "15496,11" -> ids; every comma-separated entry a decimal integer.
Expected<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t begin = 0;
  for (size_t i = 0;; ++i) {
    const size_t end = std::min(text.find(',', begin), text.size());
    std::string entry = text.substr(begin, end - begin);
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    int64_t value = 0;
    const auto [ptr, ec] = std::from_chars(entry.data(), entry.data() + entry.size(), value);
    if (entry.empty() || ec != std::errc() || ptr != entry.data() + entry.size() || value < INT32_MIN ||
        value > INT32_MAX) {
      return Status::invalid_argument("--prompt-ids '" + text + "': entry " + std::to_string(i + 1) + " ('" + entry +
                                      "') is not a token id; expected comma-separated integers, e.g. 15496,11");
    }
    ids.push_back(static_cast<int32_t>(value));
    if (end == text.size()) return ids;
    begin = end + 1;
  }
}
}  // namespace

Command add_sample_command(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  auto* run = app.add_option("--run", args->run_dir, "A run's out_dir (its final weights are in <out_dir>/model)");
  auto* model = app.add_option("--model", args->opts.model_dir, "A model directory (manifest.json + shard)");
  auto* checkpoint = app.add_option("--checkpoint", args->checkpoint_dir,
                                    "A checkpoint step directory (its master weights), or a checkpoint root (its "
                                    "`latest`)");
  run->excludes(model);
  checkpoint->excludes(run)->excludes(model);
  auto* prompt = app.add_option("--prompt,-p", args->opts.prompt,
                                "Text to continue (with GPT-2's BPE, <|endoftext|> in it is that token, as nanoGPT's "
                                "sample.py takes it)")
                     ->default_str("\\n");
  auto* prompt_ids = app.add_option("--prompt-ids", args->prompt_ids,
                                    "Token ids to continue, instead of text (a model trained on shards tokenized "
                                    "elsewhere)")
                         ->excludes(prompt)
                         ->type_name("ID,...");
  app.add_flag(
      "--ids", args->opts.emit_ids,
      "Print token ids (space-separated, the prompt's first) instead of text: no tokenizer needed. Any id of the "
      "model's vocabulary may be drawn, where text draws only ids its tokenizer has a symbol for");
  app.add_option("--tokens,-n", args->opts.tokens,
                 "Tokens to generate: each one pass over the weights (a KV cache), up to the model's block size; "
                 "past it the context slides and each token runs its whole window")
      ->default_str("300");
  app.add_option("--num-samples", args->opts.num_samples,
                 "Continuations of the prompt, each with its own random draws (the first is the one a single "
                 "sample gives), separated by a line of dashes")
      ->default_str("1");
  app.add_option("--temperature", args->opts.temperature, "Softmax temperature (> 0)")->default_str("0.8");
  app.add_option("--top-k", args->opts.top_k, "Sample from the k most likely tokens (0 = all)")->default_str("40");
  app.add_option("--top-p", args->opts.top_p,
                 "Then from the fewest most likely tokens whose probabilities sum to at least p (nucleus sampling, "
                 "as Hugging Face's top_p; 1 = off)")
      ->default_str("1");
  app.add_option("--seed", args->opts.seed, "Random seed")->default_str("1");
  app.add_option("--threads", args->opts.threads, "CPU threads (0 = all cores)")->default_str("0");
  app.add_option("--device", args->opts.device, "cpu, or cuda (the first visible GPU)")->default_str("cpu");
  app.footer(
      "Examples:\n"
      "  gpt-train sample --run runs/shakespeare-char --prompt 'ROMEO:' --tokens 300 --temperature 0.8 --top-k 40\n"
      "  gpt-train sample --model runs/quickstart/model --seed 7 --num-samples 5 --tokens 100\n"
      "  gpt-train sample --checkpoint runs/shakespeare-char/checkpoints/step_00001000 --prompt 'ROMEO:'\n"
      "  gpt-train sample --run runs/gpt2-124m --prompt-ids 15496,11 --ids   # GPT-2 BPE: tiktoken encodes and "
      "decodes\n"
      "  gpt-train sample --run runs/gpt2-1.5b --prompt-ids 15496,11 --ids --device cuda");
  return [args, prompt, prompt_ids]() -> int {
    if (args->run_dir.empty() && args->opts.model_dir.empty() && args->checkpoint_dir.empty()) {
      return report_error(Status::invalid_argument("sample needs --run DIR, --model DIR or --checkpoint DIR"));
    }
    if (prompt_ids->count() > 0) {
      Expected<std::vector<int32_t>> ids = parse_ids(args->prompt_ids);
      if (!ids) return report_error(ids.status());
      args->opts.prompt_ids = std::move(*ids);
    }
    args->opts.prompt_is_default = prompt->count() == 0 && args->opts.prompt_ids.empty();
    if (!args->run_dir.empty()) args->opts.model_dir = (std::filesystem::path(args->run_dir) / "model").string();
    if (!args->checkpoint_dir.empty()) args->opts.model_dir = resolve_checkpoint_dir(args->checkpoint_dir);
    bool emitted = false;  // an error before any text leaves stdout empty (it printed a lone newline)
    Status st = sample_text(args->opts, [&emitted](const std::string& piece) {
      emitted = true;
      std::cout << piece << std::flush;
    });
    if (emitted || st.is_ok()) std::cout << std::endl;
    if (!st.is_ok()) return report_error(st);
    return 0;
  };
}

}  // namespace gpt
