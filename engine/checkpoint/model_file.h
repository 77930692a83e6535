// The final weights of a run: a single-shard instance of the checkpoint format (engine/checkpoint/
// FORMAT.md), i.e. a directory with manifest.json (model shape, unit layout, shard list with CRC-32C) and
// shard_00000.bin (the fp32 flat buffer of all units in layout order), plus the tokenizer. Issue 4 makes
// this sharded and adds optimizer state; readers check the version.
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
  std::vector<float> weights;   // (total_numel,) units concatenated in layout order
  std::string tokenizer_path;   // absolute or relative to the caller's cwd; "" when none was saved
};

// Writes <dir>/manifest.json, <dir>/shard_00000.bin and (if tokenizer_json is non-empty) <dir>/tokenizer.json.
// The shard and tokenizer are written first, the manifest last: a directory without a manifest is not a model.
[[nodiscard]] Status save_model(const std::string& dir, const GptShape& shape, const float* weights, int64_t step,
                                const std::string& tokenizer_json);

// Reads and verifies (version, layout against the shape, file size, CRC-32C); errors name the file.
Expected<SavedModel> load_model(const std::string& dir);

}  // namespace gpt
