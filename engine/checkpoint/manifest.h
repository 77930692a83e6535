// The manifest of a checkpoint or model directory (engine/checkpoint/FORMAT.md): what was saved (model shape,
// training position, optimizer, strategy and world size at save) and where every element lives (which shard
// file holds which slice of which unit, with a CRC-32C per slice and section). Pure data plus JSON
// conversion; reading and writing the shard files is checkpoint_reader / checkpoint_writer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/layout.h"

namespace gpt {

inline constexpr int kCheckpointVersion = 2;

// Elements [begin, begin + length) of one unit's flat layout, stored in a shard file once per section.
struct ShardSlice {
  int unit = 0;
  int64_t begin = 0;
  int64_t length = 0;
  std::vector<uint32_t> crc;  // per section (version 2); empty in version 1 (the file has one CRC)
};

// One shard file. Its content is section-major: for each section, every slice's elements in slice order
// (little-endian float32), so slice i of section s starts at element s * total_elements() + (lengths before i).
struct ShardFile {
  std::string file;  // relative to the directory
  int rank = 0;      // the world rank that wrote it
  std::vector<ShardSlice> slices;
  std::optional<uint32_t> file_crc;  // version 1 only
  int64_t total_elements() const;
  int64_t bytes(size_t sections) const { return total_elements() * static_cast<int64_t>(sections) * 4; }
};

struct Manifest {
  int version = kCheckpointVersion;
  std::string kind = "checkpoint";  // "checkpoint" (resumable) or "model" (weights only)
  int64_t step = 0;                 // optimizer steps taken
  int64_t tokens_seen = 0;
  GptShape shape;
  std::vector<std::string> sections = {"master"};  // "master" [, "adam_m", "adam_v"]
  // Resume state (kind "checkpoint").
  uint64_t seed = 0;                // run.seed: init, data order and dropout are counter-based on it
  uint64_t loader_batch_index = 0;  // the next global batch of the training data loader
  int64_t global_batch = 0;         // sequences per optimizer step when saved
  std::string sampling;             // data.sampling when saved
  int64_t adam_steps = 0;           // AdamW's bias-correction step count
  float beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  std::string strategy;  // at save: single | ddp | zero1 | zero2 | zero3 | hybrid:<inner>
  int world_size = 1;
  int shard_group_size = 1;
  std::string param_dtype = "fp32", reduce_dtype = "fp32";
  std::vector<ShardFile> shards;
  std::string tokenizer;  // file name in the directory, or "" when none was saved
  std::string config;     // the run's resolved config file name, or ""
  // CRC-32C of those files' bytes (manifests written before them have none): CheckpointReader::open checks them.
  std::optional<uint32_t> tokenizer_crc, config_crc;

  int section_index(const std::string& name) const;  // -1 if absent
};

// The JSON text of `m`, with the unit layout of its shape written out for readers of other tools.
std::string manifest_to_json(const Manifest& m);

// Parses and checks a manifest: format name, version (1 or 2), a possible model shape, units that match the
// layout of that shape, shard slices inside their units. Errors name `path`.
Expected<Manifest> parse_manifest(const std::string& text, const std::string& path);

}  // namespace gpt
