// Consolidating a checkpoint's (or model directory's) fp32 master weights into one safetensors file with
// Hugging Face GPT-2 tensor names and layouts, for tools outside gpt-train (transformers' GPT2LMHeadModel,
// the safetensors library, numpy). engine/checkpoint/FORMAT.md ("Tools") has the name mapping.
//
// The file: an 8-byte little-endian u64 N, N bytes of JSON header (every tensor's dtype "F32", shape and
// data_offsets, and "__metadata__" with string values only, "format": "pt"), padded with spaces so that 8 + N
// is a multiple of 8, then the tensors' bytes back to back in layout order (wte, wpe, h.0.*, ..., ln_f).
// HF GPT-2's attention and MLP projections are Conv1D modules whose weights are (in_features, out_features):
// ours are (out, in) like nn.Linear, so those four matrices are written transposed. The LM head is tied to
// wte.weight and not written, as in Hugging Face's own GPT-2 files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_reader.h"
#include "core/status.h"
#include "model/layout.h"

namespace gpt {

struct HfTensor {
  std::string name;  // e.g. "h.3.attn.c_attn.weight"
  int unit = 0;      // index in ModelLayout::units
  int param = 0;     // index in that unit's params
  bool transpose = false;
  std::vector<int64_t> shape;  // as stored in the file: the param's shape, reversed when transposed
};

// Every tensor of the file, in file order; one per parameter of `layout`.
std::vector<HfTensor> hf_gpt2_tensors(const ModelLayout& layout);

// Hugging Face's config.json for GPT2LMHeadModel of this shape (tanh GELU "gelu_new", LayerNorm eps 1e-5, tied
// embeddings; GPT-2's <|endoftext|> as bos/eos when the vocabulary is GPT-2's 50257), beside the safetensors file
// as model.safetensors, so that GPT2LMHeadModel.from_pretrained(dir) loads the directory.
// `end_of_text`: the tokenizer's <|endoftext|> id (-1: it has none), written as bos_token_id and eos_token_id; with
// no tokenizer known, a vocabulary of GPT-2's 50257 takes GPT-2's 50256.
std::string hf_gpt2_config_json(const GptShape& shape, std::optional<int32_t> end_of_text = std::nullopt);

// Writes `out_path` atomically (out_path.tmp, fsync, rename) from `reader`'s section "master". Streams: reads
// one unit at a time, so memory is about two units (the reader's slice buffer and ours) plus 2 MiB whatever
// the model size. Errors name the shard file (bad or unreadable checkpoint) or the output file.
[[nodiscard]] Status consolidate_to_safetensors(const CheckpointReader& reader, const std::string& out_path);

}  // namespace gpt
