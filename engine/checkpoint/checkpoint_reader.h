// Reading a checkpoint or model directory at any world size and strategy. open() parses and checks the
// manifest and that every shard file is there with the size the manifest gives; read() copies any element
// range of one unit from the slices that hold it, reading only those slices' bytes (pread) and checking
// each slice's CRC-32C before using it; verify() checks every slice of every file. Errors name the file
// and the problem. A reader is used from one thread.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "core/status.h"
#include "model/layout.h"

namespace gpt {

class CheckpointReader {
 public:
  static Expected<CheckpointReader> open(const std::string& dir);

  const Manifest& manifest() const { return manifest_; }
  const ModelLayout& layout() const { return layout_; }
  const std::string& dir() const { return dir_; }
  std::string manifest_path() const;
  // Path of a file named by the manifest (tokenizer, config), "" when it names none.
  std::string file_path(const std::string& name) const;

  // Elements [begin, begin + length) of `unit` in `section` ("master", "adam_m", "adam_v") into dst.
  [[nodiscard]] Status read(const std::string& section, int unit, int64_t begin, int64_t length, float* dst) const;
  // Every slice of every shard file (or, for a version-1 directory, the file's CRC).
  [[nodiscard]] Status verify() const;
  // Bytes read from shard files so far (for tests of "reads only what it needs").
  int64_t bytes_read() const { return bytes_read_; }

 private:
  [[nodiscard]] Status read_slice(const ShardFile& f, size_t slice, int section, std::vector<float>* out) const;

  std::string dir_;
  Manifest manifest_;
  ModelLayout layout_;
  mutable int64_t bytes_read_ = 0;
};

}  // namespace gpt
