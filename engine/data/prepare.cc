#include "data/prepare.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <span>

#include "core/atomic_file.h"
#include "core/utf8.h"
#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace gpt::data {

Expected<PrepareReport> prepare_dataset(const PrepareOptions& options) {
  if (options.inputs.empty()) return Status::invalid_argument("prepare: no input files given");
  if (!(options.val_fraction >= 0.0 && options.val_fraction < 1.0)) {
    return Status::invalid_argument("prepare: --val-fraction must be in [0, 1), got " +
                                    std::to_string(options.val_fraction));
  }
  if (options.out_dir.empty()) return Status::invalid_argument("prepare: no output directory given");
  // char and byte are built here; anything else names a tokenizer's file or directory (GPT-2's BPE as published,
  // or another data set's tokenizer.json).
  std::optional<Tokenizer> given;
  if (options.tokenizer != "char" && options.tokenizer != "byte") {
    std::error_code ec;
    if (!std::filesystem::exists(options.tokenizer, ec)) {
      return Status::invalid_argument("prepare: --tokenizer " + options.tokenizer +
                                      ": expected char, byte, or a tokenizer file or directory (none is there)");
    }
    Expected<Tokenizer> loaded = Tokenizer::load(options.tokenizer);
    if (!loaded) return loaded.status().with_context("prepare: --tokenizer");
    given.emplace(std::move(*loaded));
  }
  const bool utf8 = options.tokenizer != "byte" && !(given && given->kind() == TokenizerKind::kByte);

  std::string text;
  std::vector<size_t> starts;         // where each input begins in `text`
  std::vector<std::string> warnings;  // what the caller should log: nothing is wrong, but maybe not as meant
  for (const std::string& input : options.inputs) {
    std::string content;
    GPT_RETURN_IF_ERROR(read_file(input, &content).with_context("prepare: input file"));
    if (content.empty() && options.inputs.size() > 1) warnings.push_back("input " + input + " is empty");
    starts.push_back(text.size());
    text += content;
  }
  // The input that holds byte `pos` of the joined text.
  const auto input_at = [&](size_t pos) {
    return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), pos) - starts.begin()) - 1;
  };
  // The inputs joined (a character may span two, as `split -b` cuts them).
  if (const size_t pos = utf8 ? invalid_utf8_offset(text) : std::string_view::npos; pos != std::string_view::npos) {
    const size_t i = input_at(pos);
    return Status::invalid_argument("prepare: " + options.inputs[i] + ": invalid UTF-8 at byte offset " +
                                    std::to_string(pos - starts[i]) + ": the " +
                                    std::string(given ? given->kind_name() : "char") +
                                    " tokenizer reads UTF-8 text (--tokenizer byte takes any bytes)");
  }
  if (text.empty()) return Status::invalid_argument("prepare: the input files are empty");
  if (given && given->kind() == TokenizerKind::kChar) {  // another data set's characters: each must be one of them
    const std::span<const char32_t> symbols = given->symbols();
    for (size_t pos = 0; pos < text.size();) {
      const size_t start = pos;
      char32_t cp = 0;
      decode_utf8(text, &pos, &cp);  // valid: checked above
      if (!std::binary_search(symbols.begin(), symbols.end(), cp)) {
        const size_t i = input_at(start);
        return Status::invalid_argument("prepare: " + options.inputs[i] + ": character " + describe_code_point(cp) +
                                        " at byte offset " + std::to_string(start - starts[i]) +
                                        " is not in the char vocabulary of --tokenizer " + options.tokenizer + " (" +
                                        std::to_string(symbols.size()) + " characters)");
      }
    }
  }

  Expected<Tokenizer> tokenizer =
      given ? Expected<Tokenizer>(std::move(*given)) : Tokenizer::build(options.tokenizer, text);
  if (!tokenizer) return tokenizer.status().with_context("prepare: building the tokenizer");
  Expected<std::vector<uint16_t>> tokens = std::vector<uint16_t>();
  if (const int32_t eot = tokenizer->end_of_text(); eot >= 0) {
    // GPT-2's documents: each input is one, after <|endoftext|> (as llm.c's fineweb.py writes them), and encoded
    // on its own, so that no piece spans two.
    starts.push_back(text.size());
    for (size_t i = 0; i < options.inputs.size() && tokens; ++i) {
      tokens->push_back(static_cast<uint16_t>(eot));
      const std::string_view input = std::string_view(text).substr(starts[i], starts[i + 1] - starts[i]);
      if (const size_t pos = invalid_utf8_offset(input); pos != std::string_view::npos) {  // a document is whole text
        return Status::invalid_argument("prepare: " + options.inputs[i] + ": invalid UTF-8 at byte offset " +
                                        std::to_string(pos) +
                                        ": the bpe tokenizer reads each input as a document "
                                        "of UTF-8 text (--tokenizer byte takes any bytes)");
      }
      Expected<std::vector<uint16_t>> doc = tokenizer->encode(input);
      if (!doc) return doc.status().with_context("prepare: encoding " + options.inputs[i]);
      tokens->insert(tokens->end(), doc->begin(), doc->end());
    }
  } else {
    tokens = tokenizer->encode(text);
  }
  if (tokenizer->kind() == TokenizerKind::kBpe && tokenizer->end_of_text() < 0) {
    warnings.push_back("the tokenizer has no <|endoftext|> token: the inputs are joined without a separator");
  }
  if (!tokens) return tokens.status().with_context("prepare: encoding");

  // int(n * (1 - f)) as in nanoGPT: truncation toward zero, in double precision.
  const auto n = static_cast<int64_t>(tokens->size());
  const auto n_train = static_cast<int64_t>(static_cast<double>(n) * (1.0 - options.val_fraction));
  const std::span<const uint16_t> all(*tokens);

  if (n_train == 0 || (options.val_fraction > 0.0 && n_train == n)) {
    return Status::invalid_argument("prepare: --val-fraction " + std::to_string(options.val_fraction) + " of " +
                                    std::to_string(n) + " tokens leaves the " + (n_train == 0 ? "train" : "val") +
                                    " split empty; nothing written");
  }
  const std::filesystem::path dir(options.out_dir);

  PrepareReport report;
  report.input_bytes = static_cast<int64_t>(text.size());
  report.train_tokens = n_train;
  report.val_tokens = n - n_train;
  report.vocab_size = tokenizer->vocab_size();
  report.train_path = (dir / "train.bin").string();
  if (n_train < n) report.val_path = (dir / "val.bin").string();
  report.tokenizer_path = (dir / "tokenizer.json").string();
  report.warnings = std::move(warnings);
  // All three outputs checked before any is written, so that a bad one (a directory in its place) leaves the old
  // dataset whole rather than half replaced.
  for (const std::string& path : {report.train_path, report.val_path, report.tokenizer_path}) {
    if (path.empty()) continue;
    if (Expected<std::string> target = atomic_write_target(path); !target) {
      return target.status().with_context("prepare: --out");
    }
  }
  std::error_code ec;
  const std::filesystem::path old_val = dir / "val.bin";  // with val_fraction 0, removed once the rest is written
  if (report.val_path.empty() && std::filesystem::is_directory(std::filesystem::symlink_status(old_val, ec))) {
    return Status::invalid_argument("prepare: --val-fraction 0 writes no val.bin and removes an earlier one, but " +
                                    old_val.string() + " is a directory; nothing written");
  }
  if (std::filesystem::exists(options.out_dir, ec) && !std::filesystem::is_directory(options.out_dir, ec)) {
    return Status::invalid_argument("prepare: --out " + options.out_dir + " is a file; expected a directory");
  }
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) return Status::io_error("prepare: cannot create directory " + options.out_dir + ": " + ec.message());
  GPT_RETURN_IF_ERROR(write_token_shard(report.train_path, all.first(static_cast<size_t>(n_train))));
  if (!report.val_path.empty()) {
    GPT_RETURN_IF_ERROR(write_token_shard(report.val_path, all.subspan(static_cast<size_t>(n_train))));
  }
  GPT_RETURN_IF_ERROR(tokenizer->save(report.tokenizer_path));
  if (report.val_path.empty()) {
    // An earlier prepare's val.bin would be read with this tokenizer.json: other text, maybe another vocabulary.
    report.removed_old_val = std::filesystem::remove(old_val, ec);
    if (ec) {
      return Status::io_error("prepare: --val-fraction 0 writes no val.bin, but cannot remove the earlier " +
                              old_val.string() + " (it would be read as this data set's): " + ec.message());
    }
    report.warnings.push_back(
        std::string("--val-fraction 0: no val.bin") +
        (report.removed_old_val ? " (the earlier " + old_val.string() + " was removed)" : "") +
        "; train with data.val: \"\" (no evaluations, no val loss) or point data.val at other shards");
  }
  return report;
}

}  // namespace gpt::data
