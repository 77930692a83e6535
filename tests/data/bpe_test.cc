// GPT-2's byte-level BPE against OpenAI's encoder.py: tests/fixtures/bpe holds a vocabulary learned from
// tinyshakespeare in GPT-2's file formats and the pieces and ids encoder.py gives for a set of texts and for the whole
// of tinyshakespeare (scripts/reference/gpt2_bpe_fixture.py).
#include "data/bpe.h"

#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/utf8.h"
#include "data/tokenizer.h"
#include "testing/temp_dir.h"

namespace gpt::data {
namespace {

namespace fs = std::filesystem;
using gpt::testing::TempDir;

const std::string kFixture = std::string(GPT_SOURCE_DIR) + "/tests/fixtures/bpe";

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

struct Case {
  std::string text;
  std::vector<std::string> pieces;
  std::vector<uint16_t> ids;
};

std::vector<Case> cases() {
  const YAML::Node root = YAML::LoadFile(kFixture + "/cases.json");
  std::vector<Case> out;
  for (const auto& c : root["cases"]) {
    Case k{unhex(c["utf8"].as<std::string>()), {}, {}};
    for (const auto& p : c["pieces"]) k.pieces.push_back(unhex(p.as<std::string>()));
    for (const auto& id : c["ids"]) k.ids.push_back(id.as<uint16_t>());
    out.push_back(std::move(k));
  }
  return out;
}

Tokenizer load_ok(const std::string& path) {
  Expected<Tokenizer> tok = Tokenizer::load(path);
  INFO(path << ": " << (tok ? "" : tok.status().message()));
  REQUIRE(tok.has_value());
  return std::move(*tok);
}

void check_cases(const Tokenizer& tok) {
  REQUIRE(tok.kind() == TokenizerKind::kBpe);
  CHECK(tok.vocab_size() == 857);
  CHECK(tok.end_of_text() == 856);
  for (const Case& c : cases()) {
    INFO("text: " << c.text);
    std::vector<std::string> pieces;
    for (const std::string_view p : gpt2_pieces(c.text)) pieces.emplace_back(p);
    CHECK(pieces == c.pieces);
    Expected<std::vector<uint16_t>> ids = tok.encode(c.text);
    REQUIRE(ids.has_value());
    CHECK(*ids == c.ids);
    CHECK(tok.decode(std::span<const uint16_t>(*ids)) == c.text);
  }
}

TEST_CASE("bpe: the pieces and ids of OpenAI's encoder.py, from each file format", "[data]") {
  SECTION("Hugging Face's tokenizer.json (merges as pairs, \\u escapes, the special token in added_tokens)") {
    check_cases(load_ok(kFixture + "/tokenizer.json"));
  }
  SECTION("a directory: its tokenizer.json first") { check_cases(load_ok(kFixture)); }
  SECTION("a directory of vocab.json and merges.txt, or OpenAI's encoder.json and vocab.bpe") {
    TempDir dir;
    fs::create_directories(dir.file("hf"));
    fs::create_directories(dir.file("openai"));
    fs::copy_file(kFixture + "/vocab.json", dir.file("hf/vocab.json"));
    fs::copy_file(kFixture + "/merges.txt", dir.file("hf/merges.txt"));
    fs::copy_file(kFixture + "/vocab.json", dir.file("openai/encoder.json"));
    fs::copy_file(kFixture + "/merges.txt", dir.file("openai/vocab.bpe"));
    check_cases(load_ok(dir.file("hf")));
    check_cases(load_ok(dir.file("openai")));
  }
  SECTION("gpt-train's own tokenizer.json, written and read back") {
    const Tokenizer hf = load_ok(kFixture + "/tokenizer.json");
    TempDir dir;
    REQUIRE(hf.save(dir.file("tokenizer.json")).is_ok());
    const Tokenizer ours = load_ok(dir.file("tokenizer.json"));
    CHECK(ours.to_json() == hf.to_json());
    CHECK(ours.to_json().starts_with("{\"type\":\"bpe\",\"vocab\":[\"!\",\"\\\"\",\"#\""));
    check_cases(ours);
  }
}

TEST_CASE("bpe: all of tinyshakespeare encodes to encoder.py's ids", "[data]") {
  const std::string input = std::string(GPT_SHARED_DATA_DIR) + "/tinyshakespeare.txt";
  if (!fs::exists(input)) {
    WARN("skipped: " << input << " is absent");
    return;
  }
  std::string text;
  REQUIRE(read_file(input, &text).is_ok());
  const Tokenizer tok = load_ok(kFixture);
  // encode takes a text this long in chunks, on every thread (each cut before a '\n' between printable characters).
  const std::vector<size_t> starts = BpeVocab::chunk_starts(text, size_t{256} << 10);
  CHECK(starts.size() >= 5);
  for (size_t i = 1; i + 1 < starts.size(); ++i) {
    CHECK(text[starts[i]] == '\n');
    CHECK(text[starts[i] - 1] > ' ');
    CHECK(text[starts[i] + 1] > ' ');
  }
  CHECK(BpeVocab::chunk_starts("a\n\nb c\n d " + std::string(100, 'x'), 4) == std::vector<size_t>{0, 110});
  CHECK(BpeVocab::chunk_starts("ab\ncd\nef", 3) == std::vector<size_t>{0, 5, 8});
  Expected<std::vector<uint16_t>> ids = tok.encode(text);
  REQUIRE(ids.has_value());
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the ids' little-endian bytes, as the fixture script hashes
  for (const uint16_t id : *ids) {
    for (const uint8_t b : {static_cast<uint8_t>(id & 0xFF), static_cast<uint8_t>(id >> 8)}) {
      h = (h ^ b) * 0x100000001B3ull;
    }
  }
  const YAML::Node root = YAML::LoadFile(kFixture + "/cases.json");
  CHECK(ids->size() == root["source_tokens"].as<size_t>());
  CHECK(h == std::stoull(root["source_fnv1a64"].as<std::string>(), nullptr, 16));
  CHECK(tok.decode(std::span<const uint16_t>(*ids)) == text);
}

TEST_CASE("bpe: a long piece merges in n log n, and any bytes decode back", "[data]") {
  const Tokenizer tok = load_ok(kFixture);
  // One piece of 200,000 characters: encoder.py's loop is quadratic in it, the heap is not.
  const std::string run(200000, '-');
  const auto t0 = std::chrono::steady_clock::now();
  Expected<std::vector<uint16_t>> ids = tok.encode(run);
  REQUIRE(ids.has_value());
  CHECK(tok.decode(std::span<const uint16_t>(*ids)) == run);
  CHECK(ids->size() < run.size());
  INFO("seconds: " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  // Special tokens: text to encode, tokens to encode_with_specials (at the start, twice in a row, at the end).
  const std::vector<uint16_t> text_ids = *tok.encode("<|endoftext|>");
  CHECK(text_ids.size() > 1);
  CHECK(*tok.encode_with_specials("<|endoftext|>") == std::vector<uint16_t>{856});
  std::vector<uint16_t> want = {856, 856};
  const std::vector<uint16_t> hello = *tok.encode("Hello <|endoft");
  want.insert(want.end(), hello.begin(), hello.end());
  want.push_back(856);
  CHECK(*tok.encode_with_specials("<|endoftext|><|endoftext|>Hello <|endoft<|endoftext|>") == want);
  // Ids past the vocabulary (a model's padded rows) decode to U+FFFD; a token's bytes come out as they are.
  const std::vector<int32_t> padded = {39, 857, 50303};
  CHECK(tok.decode(padded) == "H\xEF\xBF\xBD\xEF\xBF\xBD");
  Status invalid = tok.encode("ok\xC3(").status();
  CHECK(contains(invalid.message(), "invalid UTF-8 at byte offset 2"));
}

// Tokens that mean something else to a YAML reader (the files are read with yaml-cpp) are tokens like any other: as
// vocab.json's keys (special tokens in Hugging Face's tokenizer.json, which no merge needs to make), and "<<" made by
// a merge.
TEST_CASE("bpe: tokens that are YAML words or merge keys", "[data]") {
  const std::vector<std::string> extra = {"true", "null", "~~", "- x", "0x10", "&a", "*a", "!x", "%YAML", "#c"};
  std::string vocab = "{";
  std::string added;
  int id = 0;
  for (int b = 0; b < 256; ++b) {
    std::string c;
    append_utf8(bpe_byte_char(static_cast<uint8_t>(b)), &c);
    if (c == "\"" || c == "\\") c = "\\" + c;
    vocab += (b ? ", \"" : "\"") + c + "\": " + std::to_string(id++);
  }
  vocab += ", \"<<\": " + std::to_string(id++);
  for (std::string t : extra) {
    if (t == "- x") t = "-\u0120x";  // a space writes as U+0120
    added +=
        std::string(added.empty() ? "" : ", ") + "{\"id\": " + std::to_string(id) + ", \"content\": \"" + t + "\"}";
    vocab += ", \"" + t + "\": " + std::to_string(id++);
  }
  vocab += "}";
  const std::string json = "{\"added_tokens\": [" + added +
                           "], \"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": "
                           "{\"type\": \"BPE\", \"vocab\": " +
                           vocab + ", \"merges\": [\"< <\"]}}";
  TempDir dir;
  Expected<Tokenizer> tok = Tokenizer::load(dir.write("tokenizer.json", json));
  INFO(json);
  REQUIRE(tok.has_value());
  CHECK(tok->vocab_size() == 257 + static_cast<int32_t>(extra.size()));
  for (size_t i = 0; i < extra.size(); ++i) {
    const std::vector<int32_t> one = {257 + static_cast<int32_t>(i)};
    CHECK(tok->decode(one) == extra[i]);
  }
  CHECK(*tok->encode("a << b") == std::vector<uint16_t>{97, 32, 256, 32, 98});
  // Saved in gpt-train's form and read back: the special tokens are listed, so they still need no merge.
  REQUIRE(tok->save(dir.file("ours.json")).is_ok());
  Expected<Tokenizer> back = Tokenizer::load(dir.file("ours.json"));
  REQUIRE(back.has_value());
  CHECK(back->to_json() == tok->to_json());
}

TEST_CASE("bpe: bad tokenizer files name the file and the entry", "[data]") {
  TempDir dir;
  std::string vocab_text;
  REQUIRE(read_file(kFixture + "/vocab.json", &vocab_text).is_ok());
  std::string merges_text;
  REQUIRE(read_file(kFixture + "/merges.txt", &merges_text).is_ok());
  const auto dir_with = [&](const std::string& name, const std::string& vocab, const std::string& merges) {
    fs::create_directories(dir.file(name));
    dir.write(name + "/vocab.json", vocab);
    dir.write(name + "/merges.txt", merges);
    return dir.file(name);
  };
  const auto error_of = [](const std::string& path) {
    Expected<Tokenizer> tok = Tokenizer::load(path);
    return tok ? std::string() : tok.status().message();
  };
  const auto replaced = [](std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
  };
  // A merge line that is not two tokens.
  std::string e = error_of(dir_with("a", vocab_text, replaced(merges_text, "\nh e\n", "\nh e x\n")));
  CHECK(contains(e, dir.file("a/merges.txt") + ": line 3 is 'h e x', expected two tokens separated by one space"));
  // A merge of a token the vocabulary lacks.
  e = error_of(dir_with("b", vocab_text, merges_text + "qq zz\n"));
  CHECK(contains(e, "merge 600 'qq zz': 'qq' is not a token"));
  // A byte without its own token (id 0 is "!": its id given to another token leaves id 0 empty).
  e = error_of(dir_with("c", replaced(vocab_text, "{\"!\": 0,", "{\"!!\": 0,"), merges_text));
  CHECK(contains(e, "byte 33 has no token of its own ('!')"));
  // Ids with a gap.
  e = error_of(dir_with("d", replaced(vocab_text, "\"!\": 0,", "\"!\": 9999,"), merges_text));
  CHECK(contains(e, dir.file("d/vocab.json") + ": the vocabulary: ids must be 0 to 856 (one per token), each once; id "
                                               "0 has none (the next id given is 1, of '\"')"));
  // A negative id, named with its token.
  e = error_of(dir_with("n", replaced(vocab_text, "\"!\": 0,", "\"!\": -1,"), merges_text));
  CHECK(contains(e, "the vocabulary entry '!': id -1, expected 0 to 65534"));
  e = error_of(dir_with("h", replaced(vocab_text, "\"!\": 0,", "\"!\": 99999999999999999999999,"), merges_text));
  CHECK(contains(e, "the vocabulary entry '!': id 99999999999999999999999, expected 0 to 65534"));
  // A merges list cut short (a partial download): the tokens its lost merges made are made by none.
  e = error_of(dir_with("t", vocab_text, merges_text.substr(0, merges_text.find("\n", merges_text.size() / 2) + 1)));
  CHECK(contains(e, "token(s) of 857 are made by no merge"));
  CHECK(contains(e, "cut short"));
  e = error_of(dir_with("e", vocab_text, ""));
  CHECK(contains(e, "600 token(s) of 857 are made by no merge"));
  // Files that are not what they should be.
  e = error_of(dir_with("j", "this is { not json", merges_text));
  CHECK(contains(e, dir.file("j/vocab.json") + ": not valid JSON: line 1, column 1: expected a value"));
  e = error_of(dir_with("k", "[\"a\"]", merges_text));
  CHECK(contains(e, "must be a JSON object {\"token\": id, ...}"));
  // What YAML (which read these files before) took but JSON has not: a hexadecimal id, a key given twice (the
  // first won), an anchor.
  e = error_of(dir_with("x", replaced(vocab_text, "\"!\": 0,", "\"!\": 0x0,"), merges_text));
  CHECK(contains(e, dir.file("x/vocab.json") + ": not valid JSON: line 1, column 8: a number may not start with 0"));
  e = error_of(dir_with("y", replaced(vocab_text, "\"!\": 0,", "\"!\": 0, \"\\\"\": 0,"), merges_text));
  CHECK(contains(e, dir.file("y/vocab.json") + ": not valid JSON: line 1, column 19: the key \"\\\"\" again "
                                               "(first at line 1, column 10)"));
  e = error_of(dir.write("anchor.json", "{\"type\": &t \"byte\"}"));
  CHECK(contains(e, "anchor.json: not valid JSON: line 1, column 10: expected a value"));
  // Hugging Face's file with another setting, or without one, or with an option that changes the ids.
  std::string hf;
  REQUIRE(read_file(kFixture + "/tokenizer.json", &hf).is_ok());
  e = error_of(dir.write("prefix.json", replaced(hf, "\"add_prefix_space\": false", "\"add_prefix_space\": true")));
  CHECK(contains(e, "\"pre_tokenizer\" must be GPT-2's"));
  e = error_of(dir.write("nopre.json", replaced(hf, "\"pre_tokenizer\"", "\"pre_tokenizers\"")));
  CHECK(contains(e, "\"pre_tokenizer\" must be GPT-2's"));
  e = error_of(dir.write("dropout.json", replaced(hf, "\"type\": \"BPE\"", "\"type\": \"BPE\", \"dropout\": 0.5")));
  CHECK(contains(e, "\"model.dropout\" is 0.5, which GPT-2's BPE does not take"));
  e = error_of(dir.write("added.json", replaced(hf, "\"added_tokens\": [{", "\"added_tokens\": [5, {")));
  CHECK(contains(e, "added_tokens[0] is not an object"));
  e = error_of(dir.write("notype.json", "{\"vocab\": [\"a\"]}"));
  CHECK(contains(e, "expected an object with a \"type\" field"));
  // A directory without the files.
  fs::create_directories(dir.file("empty"));
  CHECK(contains(error_of(dir.file("empty")), "expected tokenizer.json, vocab.json and merges.txt"));
}

}  // namespace
}  // namespace gpt::data
