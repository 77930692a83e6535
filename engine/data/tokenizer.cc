#include "data/tokenizer.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>

#include "core/atomic_file.h"
#include "data/utf8.h"

namespace gpt::data {
namespace {

constexpr char32_t kReplacement = 0xFFFD;
constexpr char32_t kMaxCodePoint = 0x10FFFF;

Status invalid_utf8(size_t offset) {
  return Status::invalid_argument("invalid UTF-8 at byte offset " + std::to_string(offset));
}

// Control characters are escaped; so are the ones YAML 1.1 treats as line breaks or BOM (C1 controls incl.
// NEL, U+2028, U+2029, U+FEFF), because load() parses with yaml-cpp.
void append_json_string(char32_t cp, std::string* out) {
  out->push_back('"');
  switch (cp) {
    case '"':
      *out += "\\\"";
      break;
    case '\\':
      *out += "\\\\";
      break;
    case '\n':
      *out += "\\n";
      break;
    case '\r':
      *out += "\\r";
      break;
    case '\t':
      *out += "\\t";
      break;
    case '\b':
      *out += "\\b";
      break;
    case '\f':
      *out += "\\f";
      break;
    default:
      if (cp < 0x20 || (cp >= 0x7F && cp < 0xA0) || cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04X", static_cast<unsigned>(cp));
        *out += buf;
      } else {
        append_utf8(cp, out);
      }
  }
  out->push_back('"');
}

Expected<Tokenizer> parse_tokenizer_json(const YAML::Node& root) {
  if (!root.IsMap() || !root["type"]) return Status::corruption("expected an object with a \"type\" field");
  const std::string type = root["type"].as<std::string>();
  if (type == "byte") return Tokenizer::byte_level();
  if (type != "char") return Status::corruption("unknown tokenizer type \"" + type + "\", expected char or byte");
  const YAML::Node vocab = root["vocab"];
  if (!vocab || !vocab.IsSequence() || vocab.size() == 0) {
    return Status::corruption("a char tokenizer needs a non-empty \"vocab\" list");
  }
  // Rebuilding from the concatenated symbols reuses char_level's checks and sorting; then the count
  // tells whether every entry was exactly one new symbol and the order whether ids are kept.
  std::string all;
  std::vector<char32_t> listed;
  for (size_t i = 0; i < vocab.size(); ++i) {
    // JSON strings only: yaml-cpp reads 1 or true as the text "1" or "true", and its tag tells them apart
    // ("!" is a quoted scalar's, "?" a plain one's).
    if (!vocab[i].IsScalar() || vocab[i].Tag() != "!") {
      return Status::corruption("vocab entry " + std::to_string(i) + " is not a string");
    }
    const std::string s = vocab[i].Scalar();
    size_t pos = 0;
    char32_t cp = 0;
    if (s.empty() || !decode_utf8(s, &pos, &cp) || pos != s.size()) {
      return Status::corruption("vocab entry " + std::to_string(i) + " is not exactly one UTF-8 character");
    }
    listed.push_back(cp);
    all += s;
  }
  GPT_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::char_level(all));
  if (!std::equal(listed.begin(), listed.end(), tok.symbols().begin(), tok.symbols().end())) {
    return Status::corruption("vocab entries must be distinct and in ascending code point order");
  }
  return tok;
}

}  // namespace

Tokenizer Tokenizer::byte_level() { return Tokenizer(TokenizerKind::kByte, {}); }

Expected<Tokenizer> Tokenizer::char_level(std::string_view text) {
  if (text.empty()) return Status::invalid_argument("cannot build a char vocabulary from empty text");
  std::vector<bool> seen(kMaxCodePoint + 1, false);
  size_t pos = 0;
  while (pos < text.size()) {
    char32_t cp = 0;
    if (!decode_utf8(text, &pos, &cp)) return invalid_utf8(pos);
    seen[cp] = true;
  }
  std::vector<char32_t> symbols;
  for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp) {
    if (seen[cp]) symbols.push_back(cp);
  }
  if (symbols.size() > static_cast<size_t>(kMaxVocabSize)) {
    return Status::invalid_argument("the text has " + std::to_string(symbols.size()) +
                                    " distinct characters; a char vocabulary holds at most " +
                                    std::to_string(kMaxVocabSize) + " (uint16 token ids)");
  }
  return Tokenizer(TokenizerKind::kChar, std::move(symbols));
}

Expected<Tokenizer> Tokenizer::build(std::string_view kind, std::string_view text) {
  if (kind == "byte") return byte_level();
  if (kind == "char") return char_level(text);
  return Status::invalid_argument("unknown tokenizer \"" + std::string(kind) + "\", expected char or byte");
}

Expected<Tokenizer> Tokenizer::load(const std::string& path) {
  std::string text;
  GPT_RETURN_IF_ERROR(read_file(path, &text).with_context("tokenizer file"));
  try {
    Expected<Tokenizer> tok = parse_tokenizer_json(YAML::Load(text));
    if (!tok) return tok.status().with_context("tokenizer file " + path);
    return tok;
  } catch (const YAML::Exception& e) {
    return Status::corruption("tokenizer file " + path + ": not valid JSON: " + e.what());
  }
}

Status Tokenizer::save(const std::string& path) const {
  const std::string json = to_json();
  return write_file_atomically(path, {std::span<const char>(json.data(), json.size())});
}

std::string Tokenizer::to_json() const {
  if (kind_ == TokenizerKind::kByte) return "{\"type\":\"byte\"}\n";
  std::string out = "{\"type\":\"char\",\"vocab\":[";
  for (size_t i = 0; i < symbols_.size(); ++i) {
    if (i > 0) out.push_back(',');
    append_json_string(symbols_[i], &out);
  }
  return out + "]}\n";
}

int32_t Tokenizer::vocab_size() const {
  return kind_ == TokenizerKind::kByte ? 256 : static_cast<int32_t>(symbols_.size());
}

Expected<std::vector<uint16_t>> Tokenizer::encode(std::string_view text) const {
  std::vector<uint16_t> ids;
  ids.reserve(text.size());
  if (kind_ == TokenizerKind::kByte) {
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    char32_t cp = 0;
    if (!decode_utf8(text, &pos, &cp)) return invalid_utf8(pos);
    const auto it = std::lower_bound(symbols_.begin(), symbols_.end(), cp);
    if (it == symbols_.end() || *it != cp) {
      return Status::invalid_argument("character " + describe_code_point(cp) + " at byte offset " +
                                      std::to_string(start) + " is not in the char vocabulary");
    }
    ids.push_back(static_cast<uint16_t>(it - symbols_.begin()));
  }
  return ids;
}

template <typename Id>
std::string Tokenizer::decode_ids(std::span<const Id> ids) const {
  std::string out;
  out.reserve(ids.size());
  const int64_t vocab = vocab_size();
  for (Id id : ids) {
    const bool known = static_cast<int64_t>(id) >= 0 && static_cast<int64_t>(id) < vocab;
    if (kind_ == TokenizerKind::kByte && known) {
      out.push_back(static_cast<char>(id));
    } else {
      append_utf8(known ? symbols_[static_cast<size_t>(id)] : kReplacement, &out);
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const { return decode_ids(ids); }
std::string Tokenizer::decode(std::span<const uint16_t> ids) const { return decode_ids(ids); }

}  // namespace gpt::data
