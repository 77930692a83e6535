// GPT-2's byte-level BPE, as OpenAI's encoder.py, tiktoken's "gpt2" and Hugging Face's GPT2Tokenizer encode:
//   1. the text (UTF-8) is cut into pieces by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (each_gpt2_piece);
//   2. each piece's bytes start as one token each, and the merges are applied lowest rank first, every occurrence of
//      a pair from the left (a heap of candidate pairs, as Hugging Face's tokenizers keeps; for merges learned in
//      order this is encoder.py's loop, which a fixture made by encoder.py checks);
//   3. the merged tokens' vocabulary ids.
// Tokens are held as their bytes. The files write each byte as a printable character (bytes_to_unicode: 'Ġ' for a
// space), which is the "files' form" below. Special tokens (<|endoftext|>) are vocabulary entries that no merge
// makes: encode reads their text as ordinary text, as tiktoken's encode_ordinary does.
// A BpeVocab is immutable; its methods are const and thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gpt::data {

class BpeVocab {
 public:
  // `tokens`: each id's token in the files' form; `merges`: pairs of tokens in the files' form, in rank order;
  // `specials`: the ids of special tokens (<|endoftext|>), the only tokens of two bytes or more that no merge needs
  // to make. Errors name the token or merge: a token not in the files' form, two ids for one token, a byte without
  // a token of its own, a merge of tokens not in the vocabulary or whose result is not, a token no merge makes (a
  // merges list cut short would otherwise encode without its later merges).
  static Expected<BpeVocab> create(const std::vector<std::string>& tokens,
                                   const std::vector<std::pair<std::string, std::string>>& merges,
                                   const std::vector<int32_t>& specials);
  // Tokens written <|...|>: the special tokens' form in OpenAI's and Hugging Face's GPT-2 files.
  static bool looks_special(std::string_view token) {
    return token.size() > 4 && token.starts_with("<|") && token.ends_with("|>");
  }

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  // The id of the token written `token` in the files' form, or -1.
  int32_t find(std::string_view token) const;
  // Appends the ids of `text`, which must be valid UTF-8 (the caller checks).
  void encode(std::string_view text, std::vector<uint16_t>* ids) const;
  // The same tokens by id and the same merges by rank (the special tokens' list aside).
  bool same_ids(const BpeVocab& other) const { return bytes_ == other.bytes_ && merge_list_ == other.merge_list_; }
  // The special tokens of two bytes or more (<|endoftext|>), by id.
  const std::vector<int32_t>& specials() const { return specials_; }
  // The bytes id `id` stands for. REQUIRES: 0 <= id < size().
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  // {"type":"bpe","vocab":[tokens in id order],"merges":["left right", ...],"special":[ids]} in the files' form.
  std::string to_json() const;
  // The files Hugging Face's GPT2Tokenizer reads: vocab.json ({"token": id, ...}) and merges.txt ("#version: 0.2",
  // then a merge per line).
  std::string vocab_json() const;
  std::string merges_txt() const;
  // Where encode cuts a long text into chunks of about `chunk_bytes`, encoded on all threads, each alone to the ids
  // the whole text has there: the chunks' starts, then text.size().
  static std::vector<size_t> chunk_starts(std::string_view text, size_t chunk_bytes);

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void encode_piece(std::string_view piece, std::vector<uint16_t>* ids) const;
  void encode_chunk(std::string_view text, std::vector<uint16_t>* ids) const;

  std::vector<std::string> bytes_;                       // by id
  std::unordered_map<std::string, int32_t> ids_;         // bytes -> id
  std::array<int32_t, 256> byte_ids_{};                  // the one-byte tokens
  std::unordered_map<uint64_t, Merge> merges_;           // (left id, right id) -> rank and result
  std::vector<std::pair<int32_t, int32_t>> merge_list_;  // by rank, for to_json
  std::vector<int32_t> specials_;                        // the special tokens of two bytes or more
};

// Step 1: the pieces of `text` (valid UTF-8) by GPT-2's pattern, as views into it, in order.
void each_gpt2_piece(std::string_view text, const std::function<void(std::string_view)>& emit);
std::vector<std::string_view> gpt2_pieces(std::string_view text);

// bytes_to_unicode: the character that writes byte b in the files' form; and back (-1 for a character that writes
// no byte).
char32_t bpe_byte_char(uint8_t b);
int bpe_char_byte(char32_t c);

}  // namespace gpt::data
