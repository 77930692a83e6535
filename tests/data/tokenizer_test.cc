#include "data/tokenizer.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "testing/temp_dir.h"

namespace gpt::data {
namespace {

using gpt::testing::TempDir;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Escapes JSON must handle, a YAML line break (NEL), and 2-, 3- and 4-byte UTF-8.
const std::string kTricky = "a\"b\\c\nd\te\x01 \xC2\x85 caf\xC3\xA9 \xE2\x80\xA8 \xF0\x9F\x98\x80 /#:-";

TEST_CASE("char tokenizer: sorted distinct code points, round trip", "[data]") {
  Expected<Tokenizer> tok = Tokenizer::char_level("hello world\n");
  REQUIRE(tok.has_value());
  CHECK(tok->kind() == TokenizerKind::kChar);
  CHECK(tok->vocab_size() == 9);  // '\n', ' ', d, e, h, l, o, r, w
  CHECK(tok->symbols()[0] == U'\n');
  CHECK(tok->symbols()[1] == U' ');
  Expected<std::vector<uint16_t>> ids = tok->encode("hello");
  REQUIRE(ids.has_value());
  CHECK(*ids == std::vector<uint16_t>{4, 3, 5, 5, 6});
  CHECK(tok->decode(std::span<const uint16_t>(*ids)) == "hello");
  const std::vector<int32_t> with_unknown = {4, 9, -1};
  CHECK(tok->decode(with_unknown) == "h\xEF\xBF\xBD\xEF\xBF\xBD");  // U+FFFD for ids outside the vocab

  Expected<Tokenizer> tricky = Tokenizer::char_level(kTricky);
  REQUIRE(tricky.has_value());
  Expected<std::vector<uint16_t>> tricky_ids = tricky->encode(kTricky);
  REQUIRE(tricky_ids.has_value());
  CHECK(tricky_ids->size() < kTricky.size());  // multi-byte characters are one id each
  CHECK(tricky->decode(std::span<const uint16_t>(*tricky_ids)) == kTricky);
}

TEST_CASE("char tokenizer errors", "[data]") {
  Expected<Tokenizer> tok = Tokenizer::char_level("abc");
  REQUIRE(tok.has_value());
  Status unknown = tok->encode("abz").status();
  CHECK(contains(unknown.message(), "'z' (U+007A)"));
  CHECK(contains(unknown.message(), "byte offset 2"));

  Status invalid = Tokenizer::char_level("ok\xC3(").status();
  CHECK(invalid.code() == StatusCode::kInvalidArgument);
  CHECK(contains(invalid.message(), "invalid UTF-8 at byte offset 2"));
  CHECK_FALSE(Tokenizer::char_level("\xC0\x80").has_value());      // overlong NUL
  CHECK_FALSE(Tokenizer::char_level("\xED\xA0\x80").has_value());  // surrogate
  CHECK_FALSE(Tokenizer::char_level("").has_value());
  CHECK_FALSE(Tokenizer::build("bpe", "abc").has_value());
}

TEST_CASE("byte tokenizer round trip", "[data]") {
  Tokenizer tok = Tokenizer::byte_level();
  CHECK(tok.vocab_size() == 256);
  const std::string text("\x00\xFF\xC3 any bytes", 14);
  Expected<std::vector<uint16_t>> ids = tok.encode(text);
  REQUIRE(ids.has_value());
  CHECK((*ids)[1] == 255);
  CHECK(tok.decode(std::span<const uint16_t>(*ids)) == text);
}

TEST_CASE("tokenizer.json save/load round trip", "[data]") {
  TempDir dir;
  Expected<Tokenizer> tok = Tokenizer::char_level(kTricky);
  REQUIRE(tok.has_value());
  REQUIRE(tok->save(dir.file("tokenizer.json")).is_ok());
  Expected<Tokenizer> loaded = Tokenizer::load(dir.file("tokenizer.json"));
  REQUIRE(loaded.has_value());
  CHECK(loaded->kind() == TokenizerKind::kChar);
  CHECK(std::vector<char32_t>(loaded->symbols().begin(), loaded->symbols().end()) ==
        std::vector<char32_t>(tok->symbols().begin(), tok->symbols().end()));
  CHECK(tok->to_json().rfind("{\"type\":\"char\",\"vocab\":[\"\\u0001\",\"\\t\",\"\\n\",\" \",\"\\\"\"", 0) == 0);

  REQUIRE(Tokenizer::byte_level().save(dir.file("byte.json")).is_ok());
  Expected<Tokenizer> byte = Tokenizer::load(dir.file("byte.json"));
  REQUIRE(byte.has_value());
  CHECK(byte->kind() == TokenizerKind::kByte);
}

TEST_CASE("tokenizer.json errors name the file", "[data]") {
  TempDir dir;
  const std::string cases[][2] = {
      {"{\"type\":\"wordpiece\"}", "unknown tokenizer type"},
      {"{\"type\":\"char\",\"vocab\":[\"ab\"]}", "vocab entry 0"},
      {"{\"type\":\"char\",\"vocab\":[\"b\",\"a\"]}", "ascending"},
      {"{\"type\":\"char\",\"vocab\":[\"a\",\"a\"]}", "distinct"},
      {"{\"type\":\"char\",\"vocab\":[1,2]}", "vocab entry 0 is not a string"},
      {"{\"type\":\"char\",\"vocab\":[\"a\",true]}", "vocab entry 1 is not a string"},
      {"{\"type\":\"char\"", "not valid JSON"},
  };
  for (const auto& [json, problem] : cases) {
    const std::string path = dir.write("t.json", json);
    Status st = Tokenizer::load(path).status();
    INFO(json);
    CHECK_FALSE(st.is_ok());
    CHECK(contains(st.message(), path));
    CHECK(contains(st.message(), problem));
  }
  Status missing = Tokenizer::load(dir.file("none.json")).status();
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK(contains(missing.message(), dir.file("none.json")));
}

}  // namespace
}  // namespace gpt::data
