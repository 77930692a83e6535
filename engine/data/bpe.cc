#include "data/bpe.h"

#include <queue>

#include "data/unicode_classes.h"
#include "data/utf8.h"

namespace gpt::data {
namespace {

// bytes_to_unicode (encoder.py): the printable Latin-1 bytes write themselves; the others, in byte order, write
// U+0100 onwards.
struct ByteChars {
  std::array<char32_t, 256> chr{};
  std::unordered_map<char32_t, int> byte;
  ByteChars() {
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      chr[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
      byte[chr[static_cast<size_t>(b)]] = b;
    }
  }
};

const ByteChars& byte_chars() {
  static const ByteChars table;
  return table;
}

// A token in the files' form -> its bytes; false if a character writes no byte or the text is not UTF-8.
bool token_bytes(std::string_view token, std::string* out) {
  out->clear();
  for (size_t pos = 0; pos < token.size();) {
    char32_t cp = 0;
    if (!decode_utf8(token, &pos, &cp)) return false;
    const int b = bpe_char_byte(cp);
    if (b < 0) return false;
    out->push_back(static_cast<char>(b));
  }
  return !out->empty();
}

void append_files_form(const std::string& bytes, std::string* out) {
  for (const char c : bytes) append_json_escaped(bpe_byte_char(static_cast<uint8_t>(c)), out);
}

}  // namespace

char32_t bpe_byte_char(uint8_t b) { return byte_chars().chr[b]; }

int bpe_char_byte(char32_t c) {
  const auto& table = byte_chars().byte;
  const auto it = table.find(c);
  return it == table.end() ? -1 : it->second;
}

std::vector<std::string_view> gpt2_pieces(std::string_view text) {
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;  // of each code point, then text.size()
  cps.reserve(text.size());
  offsets.reserve(text.size() + 1);
  for (size_t pos = 0; pos < text.size();) {
    offsets.push_back(pos);
    char32_t cp = 0;
    if (!decode_utf8(text, &pos, &cp)) {  // the caller checks; a stray byte is its own piece rather than lost
      cp = 0xFFFD;
      pos = offsets.back() + 1;
    }
    cps.push_back(cp);
  }
  offsets.push_back(text.size());
  const size_t n = cps.size();
  const auto letter = [&](size_t k) { return k < n && is_unicode_letter(cps[k]); };
  const auto number = [&](size_t k) { return k < n && is_unicode_number(cps[k]); };
  const auto space = [&](size_t k) { return k < n && is_unicode_whitespace(cps[k]); };
  const auto other = [&](size_t k) { return k < n && !space(k) && !letter(k) && !number(k); };

  std::vector<std::string_view> pieces;
  const auto emit = [&](size_t from, size_t to) {
    pieces.push_back(text.substr(offsets[from], offsets[to] - offsets[from]));
  };
  size_t k = 0;
  while (k < n) {
    // 's|'t|'re|'ve|'m|'ll|'d (lowercase, as GPT-2's pattern has them)
    if (cps[k] == U'\'' && k + 1 < n) {
      const char32_t a = cps[k + 1];
      const char32_t b = k + 2 < n ? cps[k + 2] : 0;
      size_t len = 0;
      if (a == U's' || a == U't' || a == U'm' || a == U'd') {
        len = 2;
      } else if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) {
        len = 3;
      }
      if (len > 0) {
        emit(k, k + len);
        k += len;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space (U+0020 only), then a run of one class.
    const size_t s = cps[k] == U' ' ? k + 1 : k;
    const int cls = letter(s) ? 1 : number(s) ? 2 : other(s) ? 3 : 0;
    if (cls != 0) {
      size_t j = s;
      while (cls == 1 ? letter(j) : cls == 2 ? number(j) : other(j)) ++j;
      emit(k, j);
      k = j;
      continue;
    }
    // Whitespace: '\s+(?!\S)' takes the run but its last character when a non-space follows (that one goes with
    // the next piece, as ' word' does), '\s+' a single one.
    size_t j = k;
    while (space(j)) ++j;
    const size_t end = j == n || j - k == 1 ? j : j - 1;
    emit(k, end);
    k = end;
  }
  return pieces;
}

Expected<BpeVocab> BpeVocab::create(const std::vector<std::string>& tokens,
                                    const std::vector<std::pair<std::string, std::string>>& merges) {
  if (tokens.empty()) return Status::corruption("the BPE vocabulary is empty");
  if (tokens.size() > 65535) {
    return Status::invalid_argument("the BPE vocabulary has " + std::to_string(tokens.size()) +
                                    " tokens; token shards hold ids up to 65534 (uint16)");
  }
  BpeVocab v;
  v.byte_ids_.fill(-1);
  v.bytes_.reserve(tokens.size());
  std::string bytes;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (!token_bytes(tokens[id], &bytes)) {
      return Status::corruption("token " + std::to_string(id) + " '" + tokens[id] +
                                "' is not in byte-level form (each byte written as GPT-2's bytes_to_unicode "
                                "character)");
    }
    const auto [it, added] = v.ids_.emplace(bytes, static_cast<int32_t>(id));
    if (!added) {
      return Status::corruption("token '" + tokens[id] + "' has two ids, " + std::to_string(it->second) + " and " +
                                std::to_string(id));
    }
    if (bytes.size() == 1) v.byte_ids_[static_cast<uint8_t>(bytes[0])] = static_cast<int32_t>(id);
    v.bytes_.push_back(bytes);
  }
  for (int b = 0; b < 256; ++b) {
    if (v.byte_ids_[static_cast<size_t>(b)] < 0) {
      std::string c;
      append_utf8(bpe_byte_char(static_cast<uint8_t>(b)), &c);
      return Status::corruption("byte " + std::to_string(b) + " has no token of its own ('" + c +
                                "'): a byte-level vocabulary has all 256");
    }
  }
  v.merge_list_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto& [left, right] = merges[r];
    const std::string what = "merge " + std::to_string(r) + " '" + left + " " + right + "'";
    const int32_t l = v.find(left);
    const int32_t rt = v.find(right);
    if (l < 0 || rt < 0) return Status::corruption(what + ": '" + (l < 0 ? left : right) + "' is not a token");
    const auto result = v.ids_.find(v.bytes_[static_cast<size_t>(l)] + v.bytes_[static_cast<size_t>(rt)]);
    if (result == v.ids_.end()) return Status::corruption(what + ": '" + left + right + "' is not a token");
    // A pair listed twice keeps its first rank, as encoder.py's dict(zip(merges, range(...))) would not: refuse it.
    if (!v.merges_.emplace(pair_key(l, rt), Merge{static_cast<int32_t>(r), result->second}).second) {
      return Status::corruption(what + " is listed twice");
    }
    v.merge_list_.emplace_back(l, rt);
  }
  return v;
}

int32_t BpeVocab::find(std::string_view token) const {
  std::string bytes;
  if (!token_bytes(token, &bytes)) return -1;
  const auto it = ids_.find(bytes);
  return it == ids_.end() ? -1 : it->second;
}

void BpeVocab::encode_piece(std::string_view piece, std::vector<uint16_t>* ids) const {
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<int32_t> id(static_cast<size_t>(n)), prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    id[static_cast<size_t>(i)] = byte_ids_[static_cast<uint8_t>(piece[static_cast<size_t>(i)])];
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  // Candidates (rank, position of the pair's left token, the two ids), lowest rank first, then leftmost. An entry
  // whose tokens have merged since is stale and skipped.
  struct Candidate {
    int32_t rank, pos, left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t nx = next[static_cast<size_t>(pos)];
    if (nx < 0) return;
    const auto it = merges_.find(pair_key(id[static_cast<size_t>(pos)], id[static_cast<size_t>(nx)]));
    if (it != merges_.end()) {
      heap.push({it->second.rank, pos, id[static_cast<size_t>(pos)], id[static_cast<size_t>(nx)]});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  std::vector<bool> gone(static_cast<size_t>(n), false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto p = static_cast<size_t>(c.pos);
    const int32_t nx = next[p];
    if (gone[p] || nx < 0 || id[p] != c.left || id[static_cast<size_t>(nx)] != c.right) continue;
    id[p] = merges_.at(pair_key(c.left, c.right)).result;
    gone[static_cast<size_t>(nx)] = true;
    next[p] = next[static_cast<size_t>(nx)];
    if (next[p] >= 0) prev[static_cast<size_t>(next[p])] = c.pos;
    consider(prev[p]);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    ids->push_back(static_cast<uint16_t>(id[static_cast<size_t>(i)]));
}

void BpeVocab::encode(std::string_view text, std::vector<uint16_t>* ids) const {
  // Pieces repeat (" the", " and"): each distinct one is merged once per call.
  std::unordered_map<std::string_view, std::vector<uint16_t>> cache;
  std::vector<uint16_t> one;
  for (const std::string_view piece : gpt2_pieces(text)) {
    auto it = cache.find(piece);
    if (it == cache.end()) {
      one.clear();
      encode_piece(piece, &one);
      it = cache.emplace(piece, one).first;
    }
    ids->insert(ids->end(), it->second.begin(), it->second.end());
  }
}

std::string BpeVocab::to_json() const {
  std::string out = "{\"type\":\"bpe\",\"vocab\":[";
  for (size_t i = 0; i < bytes_.size(); ++i) {
    out += i == 0 ? "\"" : ",\"";
    append_files_form(bytes_[i], &out);
    out += '"';
  }
  out += "],\n\"merges\":[";
  for (size_t r = 0; r < merge_list_.size(); ++r) {
    out += r == 0 ? "\"" : ",\"";
    append_files_form(bytes_[static_cast<size_t>(merge_list_[r].first)], &out);
    out += ' ';
    append_files_form(bytes_[static_cast<size_t>(merge_list_[r].second)], &out);
    out += '"';
  }
  return out + "]}\n";
}

}  // namespace gpt::data
