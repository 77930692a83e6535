// Tokenizers that map text to uint16 token ids and back.
//   char: the vocabulary is the sorted set of distinct Unicode code points of a training text (the text is
//         decoded as UTF-8); a symbol's id is its index in that sorted list. On tinyshakespeare this is
//         nanoGPT's shakespeare_char vocabulary (65 symbols: '\n', ' ', '!', ...).
//   byte: 256 ids, id = byte value; every text encodes.
//   bpe:  GPT-2's byte-level BPE (bpe.h), read from Hugging Face's or OpenAI's files (load()).
// Saved as tokenizer.json: {"type":"char","vocab":["\n"," ",...]}, {"type":"byte"} or
// {"type":"bpe","vocab":[tokens by id],"merges":["a b",...],"special":[ids]}. Non-ASCII symbols are written as raw
// UTF-8, control characters as JSON escapes. A Tokenizer is an immutable value; all methods are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/bpe.h"

namespace gpt::data {

enum class TokenizerKind { kChar, kByte, kBpe };

// Ids are uint16 (the shard format), so a vocabulary holds at most this many symbols.
inline constexpr int32_t kMaxVocabSize = 65535;

class Tokenizer {
 public:
  static Tokenizer byte_level();
  // The char vocabulary of `text`. Errors: invalid UTF-8 (with the byte offset), empty text, more than
  // kMaxVocabSize distinct symbols.
  static Expected<Tokenizer> char_level(std::string_view text);
  // `kind` is "char" or "byte"; `text` is only read for "char".
  static Expected<Tokenizer> build(std::string_view kind, std::string_view text);
  // Reads a tokenizer.json written by save(), or GPT-2's BPE files as they are published: Hugging Face's
  // tokenizer.json (a byte-level BPE model), or a directory holding tokenizer.json, vocab.json and merges.txt
  // (Hugging Face) or encoder.json and vocab.bpe (OpenAI). Errors name the file.
  static Expected<Tokenizer> load(const std::string& path);
  // GPT-2's BPE from vocab.json and merges.txt (or encoder.json and vocab.bpe) named one by one.
  static Expected<Tokenizer> load_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path);
  static Tokenizer bpe(BpeVocab vocab);

  // Writes to_json() to `path` (atomically: temporary file, fsync, rename).
  [[nodiscard]] Status save(const std::string& path) const;
  std::string to_json() const;

  TokenizerKind kind() const { return kind_; }
  std::string_view kind_name() const {
    return kind_ == TokenizerKind::kChar ? "char" : kind_ == TokenizerKind::kByte ? "byte" : "bpe";
  }
  int32_t vocab_size() const;
  // Whether both give every text the same ids and every id the same text: the same kind, symbols, and (bpe) tokens
  // and merges. Unlike comparing to_json(), the special tokens' list (which changes no id) is not compared.
  bool same_ids(const Tokenizer& other) const;
  // The bpe vocabulary; null for char and byte.
  const BpeVocab* bpe_vocab() const { return bpe_.get(); }
  // The char vocabulary in id order; empty for byte.
  std::span<const char32_t> symbols() const { return symbols_; }

  // The id of GPT-2's document separator <|endoftext|> in a bpe vocabulary that has it, else -1.
  int32_t end_of_text() const;

  // char, bpe: errors on invalid UTF-8 (naming its byte offset); char: on a symbol outside the vocabulary (naming
  // it and its byte offset).
  Expected<std::vector<uint16_t>> encode(std::string_view text) const;
  // As encode, but a bpe vocabulary's special tokens written in the text (<|endoftext|>) are those tokens, as
  // tiktoken's encode(allowed_special=...) takes them (nanoGPT's sample.py does for its prompt).
  Expected<std::vector<uint16_t>> encode_with_specials(std::string_view text) const;
  // Ids outside the vocabulary (e.g. a model's padded vocab) decode to U+FFFD. bpe: the tokens' bytes as they are
  // (a character split over two tokens is whole once both are appended).
  std::string decode(std::span<const int32_t> ids) const;
  std::string decode(std::span<const uint16_t> ids) const;

 private:
  Tokenizer(TokenizerKind kind, std::vector<char32_t> symbols) : kind_(kind), symbols_(std::move(symbols)) {}
  template <typename Id>
  std::string decode_ids(std::span<const Id> ids) const;

  TokenizerKind kind_;
  std::vector<char32_t> symbols_;        // (vocab_size,) sorted ascending; char kind only
  std::shared_ptr<const BpeVocab> bpe_;  // bpe kind only
};

}  // namespace gpt::data
