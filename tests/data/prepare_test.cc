#include "data/prepare.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "data/token_shard.h"
#include "data/tokenizer.h"
#include "testing/temp_dir.h"

namespace gpt::data {
namespace {

using gpt::testing::TempDir;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST_CASE("prepare on tinyshakespeare matches nanoGPT shakespeare_char", "[data]") {
  const std::string input = std::string(GPT_SHARED_DATA_DIR) + "/tinyshakespeare.txt";
  if (!std::filesystem::exists(input)) {
    WARN("skipped: " << input << " is absent");
    return;
  }
  TempDir dir;
  PrepareOptions options;
  options.inputs = {input};
  options.out_dir = dir.file("out/shakespeare_char");  // nested: prepare creates it
  Expected<PrepareReport> report = prepare_dataset(options);
  REQUIRE(report.has_value());
  CHECK(report->vocab_size == 65);
  CHECK(report->train_tokens == 1003854);
  CHECK(report->val_tokens == 111540);

  Expected<TokenShard> train = TokenShard::open(report->train_path);
  Expected<TokenShard> val = TokenShard::open(report->val_path);
  Expected<Tokenizer> tok = Tokenizer::load(report->tokenizer_path);
  REQUIRE(train.has_value());
  REQUIRE(val.has_value());
  REQUIRE(tok.has_value());
  CHECK(train->size() == 1003854);
  CHECK(val->size() == 111540);
  CHECK(tok->vocab_size() == 65);
  // nanoGPT's itos: '\n', ' ', '!', '$', '&', "'", ... ; 'F' is 18, 'z' is 64.
  CHECK(tok->symbols()[0] == U'\n');
  CHECK(tok->symbols()[2] == U'!');
  CHECK(tok->symbols()[64] == U'z');
  CHECK(tok->decode(train->tokens().first(14)) == "First Citizen:");
  CHECK(train->tokens()[0] == 18);
}

TEST_CASE("prepare: byte tokenizer, several inputs in order", "[data]") {
  TempDir dir;
  PrepareOptions options;
  options.inputs = {dir.write("a.txt", "0123456789"), dir.write("b.txt", "abcdefghij")};
  options.tokenizer = "byte";
  options.val_fraction = 0.25;
  options.out_dir = dir.file("out");
  Expected<PrepareReport> report = prepare_dataset(options);
  REQUIRE(report.has_value());
  CHECK(report->vocab_size == 256);
  CHECK(report->train_tokens == 15);
  CHECK(report->val_tokens == 5);
  Expected<TokenShard> val = TokenShard::open(report->val_path);
  REQUIRE(val.has_value());
  CHECK(Tokenizer::byte_level().decode(val->tokens()) == "fghij");
}

TEST_CASE("prepare errors", "[data]") {
  TempDir dir;
  PrepareOptions options;
  options.out_dir = dir.file("out");
  options.inputs = {dir.write("a.txt", "abc"), dir.file("missing.txt")};
  Status missing = prepare_dataset(options).status();
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK(contains(missing.message(), dir.file("missing.txt")));

  options.inputs = {dir.write("empty.txt", "")};
  CHECK(contains(prepare_dataset(options).status().message(), "empty"));

  options.inputs = {dir.file("a.txt")};
  for (double bad : {1.0, -0.1, 1.5}) {
    options.val_fraction = bad;
    CHECK(contains(prepare_dataset(options).status().message(), "--val-fraction must be in"));
  }
  options.val_fraction = 0.1;
  std::string wide;  // 65536 distinct 4-byte characters: one more than uint16 ids allow
  for (char32_t cp = 0x10000; cp < 0x20000; ++cp) {
    wide += {static_cast<char>(0xF0 | (cp >> 18)), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
             static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
  }
  options.inputs = {dir.write("wide.txt", wide)};
  CHECK(contains(prepare_dataset(options).status().message(), "65536 distinct characters"));

  options.inputs = {dir.file("a.txt")};
  options.tokenizer = "bpe";
  CHECK(contains(prepare_dataset(options).status().message(), "bpe"));
  CHECK_FALSE(std::filesystem::exists(dir.file("out/train.bin")));
}

// Another data set's char tokenizer: a character it lacks is named with its input and the offset in that input (it
// was the offset in the inputs joined). An empty input among others is a warning.
TEST_CASE("prepare with another data set's char tokenizer", "[data]") {
  TempDir dir;
  PrepareOptions options;
  options.inputs = {dir.write("first.txt", "abcabcabcabc\n")};
  options.out_dir = dir.file("first");
  REQUIRE(prepare_dataset(options).has_value());
  options.tokenizer = dir.file("first/tokenizer.json");
  options.out_dir = dir.file("second");
  options.inputs = {dir.write("a.txt", "cab\n"), dir.write("empty.txt", ""), dir.write("b.txt", "abc\ncaf\xc3\xa9\n")};
  const Status st = prepare_dataset(options).status();
  CHECK(contains(st.message(), "prepare: " + dir.file("b.txt") +
                                   ": character 'f' (U+0066) at byte offset 6 is not in "
                                   "the char vocabulary of --tokenizer " +
                                   options.tokenizer + " (4 characters)"));
  CHECK_FALSE(std::filesystem::exists(dir.file("second")));
  options.inputs = {dir.file("a.txt"), dir.file("empty.txt"), dir.write("c.txt", "abc\nabc\n")};
  Expected<PrepareReport> report = prepare_dataset(options);
  REQUIRE(report.has_value());
  CHECK(report->train_tokens + report->val_tokens == 12);
  REQUIRE(report->warnings.size() == 1);
  CHECK(report->warnings[0] == "input " + dir.file("empty.txt") + " is empty");
}

}  // namespace
}  // namespace gpt::data
