// A model directory (weights only, kind "model" of the checkpoint format in engine/checkpoint/FORMAT.md)
// written or read whole by one process: what `gpt-train sample` and small tools use. Training runs write
// their final weights sharded, from every rank (Trainer); load_model reads any number of shards, any
// checkpoint directory (its master weights) and version-1 model directories.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/layout.h"

namespace gpt {

struct SavedModel {
  GptShape shape;
  int64_t step = 0;
  std::vector<float> weights;  // (total_numel,) units concatenated in layout order
  std::string tokenizer_path;  // absolute or relative to the caller's cwd; "" when none was saved
};

// Writes <dir> atomically (save_checkpoint on one rank): one shard, the tokenizer if non-empty, the manifest.
[[nodiscard]] Status save_model(const std::string& dir, const GptShape& shape, const float* weights, int64_t step,
                                const std::string& tokenizer_json);

// Reads and verifies (version, layout against the shape, file sizes, CRC-32C); errors name the file.
Expected<SavedModel> load_model(const std::string& dir);

}  // namespace gpt
