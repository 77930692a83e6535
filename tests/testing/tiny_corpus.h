// A small corpus for training tests: `text` prepared (byte tokenizer) into <dir>/data/{train,val}.bin, once per
// TempDir (later calls find it there).
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "data/prepare.h"
#include "testing/temp_dir.h"

namespace gpt::testing {

inline void prepare_corpus(const TempDir& dir, const std::string& text) {
  if (std::filesystem::exists(dir.file("data/train.bin"))) return;
  data::PrepareOptions prep;
  prep.inputs = {dir.write("corpus.txt", text)};
  prep.out_dir = dir.file("data");
  REQUIRE(data::prepare_dataset(prep).has_value());
}

}  // namespace gpt::testing
