#include "data/token_shard.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "testing/temp_dir.h"

namespace gpt::data {
namespace {

using gpt::testing::TempDir;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Overwrites one int32 of the header in place.
void patch_header(const std::string& path, int index, int32_t value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(index * 4);
  f.write(reinterpret_cast<const char*>(&value), 4);
}

TEST_CASE("token shard round trip, llm.c layout", "[data]") {
  TempDir dir;
  const std::string path = dir.file("a.bin");
  const std::vector<uint16_t> tokens = {0, 1, 65535, 42, 7};
  REQUIRE(write_token_shard(path, tokens).is_ok());
  REQUIRE_FALSE(std::filesystem::exists(path + ".tmp"));
  REQUIRE(std::filesystem::file_size(path) == 1024 + 2 * tokens.size());

  std::ifstream in(path, std::ios::binary);
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 5);
  CHECK(header[3] == 0);

  Expected<TokenShard> shard = TokenShard::open(path);
  REQUIRE(shard.has_value());
  CHECK(shard->path() == path);
  CHECK(shard->size() == 5);
  CHECK(std::vector<uint16_t>(shard->tokens().begin(), shard->tokens().end()) == tokens);
  CHECK(shard->max_token() == 65535);

  TokenShard moved = std::move(*shard);
  CHECK(moved.max_token() == 65535);
  CHECK(moved.tokens()[3] == 42);

  REQUIRE(write_token_shard(dir.file("empty.bin"), {}).is_ok());
  Expected<TokenShard> empty = TokenShard::open(dir.file("empty.bin"));
  REQUIRE(empty.has_value());
  CHECK(empty->size() == 0);
  CHECK(empty->max_token() == -1);
}

TEST_CASE("token shard errors name the file and the problem", "[data]") {
  TempDir dir;
  const std::vector<uint16_t> tokens(100, 3);
  const std::string path = dir.file("shard.bin");

  SECTION("missing file") {
    Status st = TokenShard::open(dir.file("nope.bin")).status();
    CHECK(st.code() == StatusCode::kNotFound);
    CHECK(contains(st.message(), dir.file("nope.bin")));
  }
  SECTION("bad magic") {
    REQUIRE(write_token_shard(path, tokens).is_ok());
    patch_header(path, 0, 12345);
    Status st = TokenShard::open(path).status();
    CHECK(st.code() == StatusCode::kCorruption);
    CHECK(contains(st.message(), path));
    CHECK(contains(st.message(), "magic"));
    CHECK(contains(st.message(), "12345"));
    CHECK(contains(st.message(), "20240520"));
  }
  SECTION("wrong version") {
    REQUIRE(write_token_shard(path, tokens).is_ok());
    patch_header(path, 1, 2);
    Status st = TokenShard::open(path).status();
    CHECK(contains(st.message(), path));
    CHECK(contains(st.message(), "version 2"));
  }
  SECTION("truncated body: size disagrees with the count") {
    REQUIRE(write_token_shard(path, tokens).is_ok());
    std::filesystem::resize_file(path, 1024 + 150);
    Status st = TokenShard::open(path).status();
    CHECK(st.code() == StatusCode::kCorruption);
    CHECK(contains(st.message(), path));
    CHECK(contains(st.message(), "1224"));  // expected bytes
    CHECK(contains(st.message(), "1174"));  // actual bytes
  }
  SECTION("shorter than the header") {
    std::ofstream(path, std::ios::binary) << "short";
    Status st = TokenShard::open(path).status();
    CHECK(contains(st.message(), path));
    CHECK(contains(st.message(), "header"));
  }
}

}  // namespace
}  // namespace gpt::data
