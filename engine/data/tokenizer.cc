#include "data/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/atomic_file.h"
#include "core/json.h"
#include "core/utf8.h"

namespace gpt::data {
namespace {

constexpr char32_t kReplacement = 0xFFFD;
constexpr char32_t kMaxCodePoint = 0x10FFFF;

Status invalid_utf8(size_t offset) {
  return Status::invalid_argument("invalid UTF-8 at byte offset " + std::to_string(offset));
}

void append_json_string(char32_t cp, std::string* out) {
  out->push_back('"');
  append_json_escaped(cp, out);
  out->push_back('"');
}

bool is_string(const json::Value* n) { return n != nullptr && n->is_string(); }

// Text from a file as a message quotes it: control bytes as \xNN.
std::string quoted(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return "'" + out + "'";
}

// "left right" -> the pair (byte-level tokens hold no space: U+0020 writes no byte).
Expected<std::pair<std::string, std::string>> split_merge(const std::string& line, const std::string& where) {
  const size_t space = line.find(' ');
  if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
      line.find(' ', space + 1) != std::string::npos) {
    return Status::corruption(where + " is " + quoted(line) + ", expected two tokens separated by one space");
  }
  return std::make_pair(line.substr(0, space), line.substr(space + 1));
}

// A merges list as tokenizer.json files hold it: "a b" strings, or (newer Hugging Face files) ["a", "b"] pairs.
Expected<std::vector<std::pair<std::string, std::string>>> read_merges(const json::Value* list, const char* key) {
  if (list == nullptr || !list->is_array()) return Status::corruption(std::string("expected a \"") + key + "\" list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json::Value& m = list->item(i);
    const std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    if (m.is_string()) {
      GPT_ASSIGN_OR_RETURN(auto pair, split_merge(m.text(), where));
      merges.push_back(std::move(pair));
    } else if (m.is_array() && m.size() == 2 && m.item(0).is_string() && m.item(1).is_string()) {
      merges.emplace_back(m.item(0).text(), m.item(1).text());
    } else {
      return Status::corruption(where + " is not a \"a b\" string or a pair of strings");
    }
  }
  return merges;
}

struct Vocab {
  std::vector<std::string> tokens;  // by id
  std::vector<int32_t> specials;    // ids
};

// A {token: id} map (vocab.json, a Hugging Face model's "vocab") plus `added` ({"id", "content"} objects that may
// be missing from it) -> the tokens by id; the ids must be 0..n-1, each once. The added tokens and those written
// <|...|> are the special ones.
Expected<Vocab> tokens_by_id(const json::Value* map, const json::Value* added, const std::string& key) {
  if (map == nullptr || !map->is_object() || map->size() == 0) {
    return Status::corruption(key + " must be a JSON object {\"token\": id, ...} of at least one token");
  }
  std::vector<std::pair<int64_t, std::string>> entries;
  Vocab v;
  // `token` (null when not a string) with `id`, else what is wrong with them (`where` names the entry in it).
  const auto take = [&](const std::string* token, const json::Value* id, const auto& where) -> Status {
    if (token == nullptr) return Status::corruption(where() + ": the token is not a string");
    const std::optional<int64_t> value = id != nullptr ? id->as_int64() : std::nullopt;
    if (!value && id != nullptr && id->is_number() && id->text().find_first_of(".eE") == std::string::npos) {
      return Status::corruption(where() + ": id " + id->text() + ", expected 0 to " +
                                std::to_string(kMaxVocabSize - 1) + " (token shards hold uint16 ids)");
    }
    if (!value) return Status::corruption(where() + ": the id is not an integer");
    if (*value < 0 || *value >= kMaxVocabSize) {
      return Status::corruption(where() + ": id " + std::to_string(*value) + ", expected 0 to " +
                                std::to_string(kMaxVocabSize - 1) + " (token shards hold uint16 ids)");
    }
    entries.emplace_back(*value, *token);
    return Status::ok();
  };
  entries.reserve(map->size());
  for (size_t i = 0; i < map->size(); ++i) {
    GPT_RETURN_IF_ERROR(take(&map->key(i), &map->item(i), [&] { return key + " entry " + quoted(map->key(i)); }));
  }
  if (added != nullptr && !added->is_null()) {
    if (!added->is_array()) return Status::corruption("\"added_tokens\" is not a list");
    for (size_t i = 0; i < added->size(); ++i) {
      const std::string where = "added_tokens[" + std::to_string(i) + "]";
      const json::Value& a = added->item(i);
      if (!a.is_object()) return Status::corruption(where + " is not an object with \"id\" and \"content\"");
      const json::Value* content = a.find("content");
      GPT_RETURN_IF_ERROR(take(is_string(content) ? &content->text() : nullptr, a.find("id"), [&] { return where; }));
      // An added token's content is its text, where the vocabulary writes tokens in byte-level form: one the
      // vocabulary lists already (GPT-2's <|endoftext|>) is that entry; another one is added in that form.
      auto [id, text] = entries.back();
      entries.pop_back();
      v.specials.push_back(static_cast<int32_t>(id));
      if (std::any_of(entries.begin(), entries.end(), [&](const auto& e) { return e.first == id; })) continue;
      std::string form;
      for (const char c : text) append_utf8(bpe_byte_char(static_cast<uint8_t>(c)), &form);
      entries.emplace_back(id, std::move(form));
    }
  }
  std::sort(entries.begin(), entries.end());
  entries.erase(std::unique(entries.begin(), entries.end()), entries.end());  // an added token listed in both
  v.tokens.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first != static_cast<int64_t>(i)) {
      const bool twice = entries[i].first < static_cast<int64_t>(i);  // entries[i - 1] has its id
      const auto& [id, token] = entries[i];
      return Status::corruption(key + ": ids must be 0 to " + std::to_string(entries.size() - 1) +
                                " (one per token), each once; " +
                                (twice ? "id " + std::to_string(id) + " has two tokens, the second " + quoted(token)
                                       : "id " + std::to_string(i) + " has none (the next id given is " +
                                             std::to_string(id) + ", of " + quoted(token) + ")"));
    }
    v.tokens.push_back(entries[i].second);
  }
  for (size_t id = 0; id < v.tokens.size(); ++id) {  // <|...|> tokens are special whether listed as added or not
    if (BpeVocab::looks_special(v.tokens[id])) v.specials.push_back(static_cast<int32_t>(id));
  }
  return v;
}

Expected<Tokenizer> make_bpe(const Vocab& vocab, const std::vector<std::pair<std::string, std::string>>& merges) {
  GPT_ASSIGN_OR_RETURN(BpeVocab bpe, BpeVocab::create(vocab.tokens, merges, vocab.specials));
  return Tokenizer::bpe(std::move(bpe));
}

// A field that must be absent, null, or the one value GPT-2's has: `value` is "false" or "true" for a boolean, ""
// for an empty string.
bool absent_or(const json::Value* n, const char* value) {
  if (n == nullptr || n->is_null()) return true;
  if (n->is_bool()) return std::string_view(n->boolean() ? "true" : "false") == value;
  return *value == '\0' && n->is_string() && n->text().empty();
}

// A field's value as a message quotes it.
std::string shown(const json::Value& n) {
  if (n.is_bool()) return n.boolean() ? "true" : "false";
  if (n.is_string()) return quoted(n.text());
  if (n.is_number()) return n.text();
  return std::string(json::type_name(n.type()));
}

// Hugging Face's tokenizer.json, held to what GPT-2's is: a BPE model under the byte-level pre-tokenizer, with no
// normalizer, no prefix space and none of the model's options that change the ids (anything else would encode other
// ids than its own library does).
Expected<Tokenizer> parse_hf_tokenizer(const json::Value& root) {
  const json::Value* model = root.find("model");
  if (model == nullptr || !model->is_object() || !is_string(model->find("type")) ||
      model->find("type")->text() != "BPE") {
    return Status::corruption("a Hugging Face tokenizer.json with a \"model\" of type \"BPE\" (GPT-2's) was expected");
  }
  const json::Value* pre = root.find("pre_tokenizer");
  if (pre == nullptr || !pre->is_object() || !is_string(pre->find("type")) ||
      pre->find("type")->text() != "ByteLevel" || !absent_or(pre->find("add_prefix_space"), "false") ||
      !absent_or(pre->find("use_regex"), "true")) {
    return Status::corruption(
        "\"pre_tokenizer\" must be GPT-2's: ByteLevel with add_prefix_space false and use_regex true");
  }
  if (const json::Value* norm = root.find("normalizer"); norm != nullptr && !norm->is_null()) {
    return Status::corruption("\"normalizer\" must be null, as GPT-2's is");
  }
  for (const auto& [field, value] :
       {std::pair{"dropout", ""}, std::pair{"continuing_subword_prefix", ""}, std::pair{"end_of_word_suffix", ""},
        std::pair{"ignore_merges", "false"}, std::pair{"byte_fallback", "false"}}) {
    if (const json::Value* f = model->find(field); !absent_or(f, value)) {
      return Status::corruption(std::string("\"model.") + field + "\" is " + shown(*f) +
                                ", which GPT-2's BPE does not take (" + (*value ? value : "null or \"\"") + ")");
    }
  }
  GPT_ASSIGN_OR_RETURN(Vocab vocab, tokens_by_id(model->find("vocab"), root.find("added_tokens"), "\"model.vocab\""));
  GPT_ASSIGN_OR_RETURN(auto merges, read_merges(model->find("merges"), "model.merges"));
  return make_bpe(vocab, merges);
}

Expected<Tokenizer> parse_tokenizer_json(const json::Value& root) {
  if (!root.is_object()) return Status::corruption("expected a JSON object");
  const json::Value* type_field = root.find("type");
  if (root.find("model") != nullptr && type_field == nullptr) return parse_hf_tokenizer(root);
  if (type_field == nullptr && root.size() > 0 && root.item(0).is_number()) {
    return Status::corruption(
        "this is a vocabulary of {\"token\": id} (vocab.json or encoder.json): give the directory that holds it and "
        "merges.txt (or vocab.bpe)");
  }
  if (!is_string(type_field)) return Status::corruption("expected an object with a \"type\" field");
  const std::string& type = type_field->text();
  if (type == "byte") return Tokenizer::byte_level();
  const json::Value* vocab = root.find("vocab");
  if (type == "bpe") {
    if (vocab == nullptr || !vocab->is_array()) return Status::corruption("a bpe tokenizer needs a \"vocab\" list");
    std::vector<std::string> tokens;
    tokens.reserve(vocab->size());
    for (size_t i = 0; i < vocab->size(); ++i) {
      if (!vocab->item(i).is_string()) {
        return Status::corruption("vocab entry " + std::to_string(i) + " is not a string");
      }
      tokens.push_back(vocab->item(i).text());
    }
    GPT_ASSIGN_OR_RETURN(auto merges, read_merges(root.find("merges"), "merges"));
    std::vector<int32_t> specials;  // written by to_json; absent: the <|...|> tokens
    if (const json::Value* sp = root.find("special"); sp != nullptr) {
      if (!sp->is_array()) return Status::corruption("\"special\" is not a list of ids");
      for (size_t i = 0; i < sp->size(); ++i) {
        const std::optional<int64_t> id = sp->item(i).as_int64();
        if (!id || *id < 0 || *id >= static_cast<int64_t>(tokens.size())) {
          return Status::corruption("special[" + std::to_string(i) + "] is " + shown(sp->item(i)) +
                                    ", not an id of the vocabulary (0 to " + std::to_string(tokens.size() - 1) + ")");
        }
        specials.push_back(static_cast<int32_t>(*id));
      }
    } else {
      for (size_t id = 0; id < tokens.size(); ++id) {
        if (BpeVocab::looks_special(tokens[id])) specials.push_back(static_cast<int32_t>(id));
      }
    }
    return make_bpe(Vocab{std::move(tokens), std::move(specials)}, merges);
  }
  if (type != "char") {
    return Status::corruption("unknown tokenizer type \"" + type + "\", expected char, byte or bpe");
  }
  if (vocab == nullptr || !vocab->is_array() || vocab->size() == 0) {
    return Status::corruption("a char tokenizer needs a non-empty \"vocab\" list");
  }
  // Rebuilding from the concatenated symbols reuses char_level's checks and sorting; then the count
  // tells whether every entry was exactly one new symbol and the order whether ids are kept.
  std::string all;
  std::vector<char32_t> listed;
  for (size_t i = 0; i < vocab->size(); ++i) {
    if (!vocab->item(i).is_string()) {
      return Status::corruption("vocab entry " + std::to_string(i) + " is not a string");
    }
    const std::string& s = vocab->item(i).text();
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

Tokenizer Tokenizer::bpe(BpeVocab vocab) {
  Tokenizer tok(TokenizerKind::kBpe, {});
  tok.bpe_ = std::make_shared<const BpeVocab>(std::move(vocab));
  return tok;
}

namespace {

Expected<json::Value> read_json(const std::string& path) {
  std::string text;
  GPT_RETURN_IF_ERROR(read_file(path, &text).with_context("tokenizer file"));
  Expected<json::Value> v = json::parse(text);
  if (!v) return v.status().with_context("tokenizer file " + path);
  return v;
}

}  // namespace

// vocab.json + merges.txt (encoder.json + vocab.bpe: the same formats).
Expected<Tokenizer> Tokenizer::load_vocab_and_merges(const std::string& vocab_path, const std::string& merges_path) {
  GPT_ASSIGN_OR_RETURN(json::Value vocab, read_json(vocab_path));
  Expected<Vocab> tokens = tokens_by_id(&vocab, nullptr, "the vocabulary");
  if (!tokens) return tokens.status().with_context("tokenizer file " + vocab_path);
  std::string text;
  GPT_RETURN_IF_ERROR(read_file(merges_path, &text).with_context("tokenizer file"));
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    auto pair = split_merge(line, "line " + std::to_string(line_no));
    if (!pair) return pair.status().with_context("tokenizer file " + merges_path);
    merges.push_back(std::move(*pair));
  }
  auto tok = make_bpe(*tokens, merges);
  if (!tok) return tok.status().with_context("tokenizer files " + vocab_path + " and " + merges_path);
  return tok;
}

Expected<Tokenizer> Tokenizer::load(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::filesystem::path dir(path);
    const auto has = [&](const char* name) { return std::filesystem::is_regular_file(dir / name, ec); };
    if (has("tokenizer.json")) return load((dir / "tokenizer.json").string());
    for (const auto& [vocab, merges] :
         {std::pair{"vocab.json", "merges.txt"}, std::pair{"encoder.json", "vocab.bpe"}}) {
      if (has(vocab) && has(merges)) return load_vocab_and_merges((dir / vocab).string(), (dir / merges).string());
    }
    return Status::not_found("tokenizer directory " + path +
                             ": expected tokenizer.json, vocab.json and merges.txt (Hugging Face's GPT-2), or "
                             "encoder.json and vocab.bpe (OpenAI's) in it");
  }
  GPT_ASSIGN_OR_RETURN(json::Value root, read_json(path));
  Expected<Tokenizer> tok = parse_tokenizer_json(root);
  if (!tok) return tok.status().with_context("tokenizer file " + path);
  return tok;
}

Status Tokenizer::save(const std::string& path) const {
  const std::string json = to_json();
  return write_file_atomically(path, {std::span<const char>(json.data(), json.size())});
}

std::string Tokenizer::to_json() const {
  if (kind_ == TokenizerKind::kByte) return "{\"type\":\"byte\"}\n";
  if (kind_ == TokenizerKind::kBpe) return bpe_->to_json();
  std::string out = "{\"type\":\"char\",\"vocab\":[";
  for (size_t i = 0; i < symbols_.size(); ++i) {
    if (i > 0) out.push_back(',');
    append_json_string(symbols_[i], &out);
  }
  return out + "]}\n";
}

int32_t Tokenizer::vocab_size() const {
  if (kind_ == TokenizerKind::kBpe) return bpe_->size();
  return kind_ == TokenizerKind::kByte ? 256 : static_cast<int32_t>(symbols_.size());
}

bool Tokenizer::same_ids(const Tokenizer& other) const {
  if (kind_ != other.kind_) return false;
  if (kind_ == TokenizerKind::kChar) return symbols_ == other.symbols_;
  if (kind_ == TokenizerKind::kBpe) return bpe_->same_ids(*other.bpe_);
  return true;
}

int32_t Tokenizer::end_of_text() const { return kind_ == TokenizerKind::kBpe ? bpe_->find("<|endoftext|>") : -1; }

Expected<std::vector<uint16_t>> Tokenizer::encode(std::string_view text) const {
  std::vector<uint16_t> ids;
  ids.reserve(text.size());
  if (kind_ == TokenizerKind::kByte) {
    for (char c : text) ids.push_back(static_cast<uint8_t>(c));
    return ids;
  }
  if (kind_ == TokenizerKind::kBpe) {
    if (const size_t bad = invalid_utf8_offset(text); bad != std::string_view::npos) return invalid_utf8(bad);
    bpe_->encode(text, &ids);
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

Expected<std::vector<uint16_t>> Tokenizer::encode_with_specials(std::string_view text) const {
  if (kind_ != TokenizerKind::kBpe || bpe_->specials().empty()) return encode(text);
  if (const size_t bad = invalid_utf8_offset(text); bad != std::string_view::npos) return invalid_utf8(bad);
  std::vector<uint16_t> ids;
  for (size_t begin = 0;;) {
    // The first special token written at or after `begin` (the longest of those starting there).
    size_t at = std::string_view::npos;
    int32_t which = -1;
    for (const int32_t id : bpe_->specials()) {
      const std::string& s = bpe_->bytes(id);
      const size_t p = text.find(s, begin);
      if (p < at || (p == at && p != std::string_view::npos && s.size() > bpe_->bytes(which).size())) {
        at = p;
        which = id;
      }
    }
    const size_t end = at == std::string_view::npos ? text.size() : at;
    Expected<std::vector<uint16_t>> part = encode(text.substr(begin, end - begin));
    if (!part) return part.status();
    ids.insert(ids.end(), part->begin(), part->end());
    if (which < 0) return ids;
    ids.push_back(static_cast<uint16_t>(which));
    begin = at + bpe_->bytes(which).size();
  }
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
    } else if (kind_ == TokenizerKind::kBpe && known) {
      out += bpe_->bytes(static_cast<int32_t>(id));
    } else {
      append_utf8(known ? symbols_[static_cast<size_t>(id)] : kReplacement, &out);
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const { return decode_ids(ids); }
std::string Tokenizer::decode(std::span<const uint16_t> ids) const { return decode_ids(ids); }

}  // namespace gpt::data
