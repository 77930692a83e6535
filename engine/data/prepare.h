// `prepare`: turns text files into a training data set, as nanoGPT's data/shakespeare_char/prepare.py does.
// The inputs are concatenated in the order given; the tokenizer is built from the whole text (or read from a file);
// the token sequence is split into train = the first int(n * (1 - val_fraction)) tokens and val = the rest. A
// tokenizer with GPT-2's <|endoftext|> takes each input as a document: that token, then the input's (a bpe one
// without it joins the inputs, with a warning). Writes
//   out_dir/train.bin, out_dir/val.bin   (token shards, see token_shard.h; no val.bin with val_fraction 0)
//   out_dir/tokenizer.json               (see tokenizer.h)
// creating out_dir if needed. Each file is written atomically, so a failed run leaves no partial file. With
// val_fraction 0 a val.bin already in out_dir (an earlier prepare's, of other text or another vocabulary) is removed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gpt::data {

struct PrepareOptions {
  // Text files to read, concatenated in this order. At least one; together not empty.
  std::vector<std::string> inputs;
  // "char" (vocabulary = the distinct characters of the inputs), "byte" (256 ids), or a path that Tokenizer::load
  // reads: GPT-2's BPE files (Hugging Face's tokenizer.json, a directory with vocab.json and merges.txt), or a
  // tokenizer.json of another data set, whose vocabulary this one then shares.
  std::string tokenizer = "char";
  // Fraction of tokens that go to val.bin, taken from the end; in [0, 1). 0: no val.bin (train with data.val "").
  double val_fraction = 0.1;
  // Directory for train.bin, val.bin and tokenizer.json; created if missing.
  std::string out_dir;
};

struct PrepareReport {
  int64_t input_bytes = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  int32_t vocab_size = 0;
  std::string train_path, val_path, tokenizer_path;  // val_path empty: no val split
  bool removed_old_val = false;                      // val_fraction 0 removed an earlier val.bin
  std::vector<std::string> warnings;  // what the caller should log: nothing is wrong, but maybe not as meant
};

Expected<PrepareReport> prepare_dataset(const PrepareOptions& options);

}  // namespace gpt::data
