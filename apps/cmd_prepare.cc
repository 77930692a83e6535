#include <spdlog/spdlog.h>

#include <memory>

#include "apps/commands.h"
#include "data/prepare.h"

namespace gpt {

Command add_prepare_command(CLI::App& app) {
  auto opts = std::make_shared<data::PrepareOptions>();
  app.add_option("--input,-i", opts->inputs, "Text files, concatenated in the order given")->required();
  app.add_option("--tokenizer", opts->tokenizer,
                 "char (vocabulary of the text's characters), byte, or a tokenizer to read: GPT-2's BPE as Hugging "
                 "Face publishes it (tokenizer.json, or a directory with vocab.json and merges.txt, or OpenAI's "
                 "encoder.json and vocab.bpe; each input is then a document after <|endoftext|>), or another data "
                 "set's tokenizer.json")
      ->default_str("char");
  app.add_option("--val-fraction", opts->val_fraction, "Fraction of the text, taken from its end, for validation")
      ->default_str("0.1");
  app.add_option("--out,-o", opts->out_dir, "Output directory for train.bin, val.bin and tokenizer.json")->required();
  app.footer(
      "Examples:\n"
      "  gpt-train prepare --input ../shared/data/tinyshakespeare.txt --out data/shakespeare_char\n"
      "  gpt-train prepare -i a.txt -i b.txt --tokenizer byte --val-fraction 0.05 --out data/mine\n"
      "  gpt-train prepare -i input.txt --tokenizer gpt2/ --out data/mine_gpt2   # gpt2/: Hugging Face's files");
  return [opts]() -> int {
    auto report = data::prepare_dataset(*opts);
    if (!report) return report_error(report.status());
    for (const std::string& w : report->warnings) spdlog::warn("prepare: {}", w);
    spdlog::info("prepared {}: {} train tokens, {} val tokens, vocab {} (tokenizer {})", opts->out_dir,
                 report->train_tokens, report->val_tokens, report->vocab_size, opts->tokenizer);
    return 0;
  };
}

}  // namespace gpt
