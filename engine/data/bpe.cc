#include "data/bpe.h"

#include <omp.h>

#include <algorithm>
#include <functional>
#include <queue>

#include "core/utf8.h"
#include "data/unicode_classes.h"

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

void each_gpt2_piece(std::string_view text, const std::function<void(std::string_view)>& emit) {
  // The pattern read left to right, decoding as it goes (no per-character arrays: a big input costs no more than
  // itself). Each alternative's class, of the code point at byte `pos`; `next` gets where the following one starts.
  enum Class { kEnd, kLetter, kNumber, kSpace, kOther };
  const size_t n = text.size();
  const auto class_at = [&](size_t pos, size_t* next) {
    if (pos >= n) {
      *next = n;
      return kEnd;
    }
    char32_t cp = 0;
    size_t p = pos;
    if (!decode_utf8(text, &p, &cp)) {  // the caller checks; a stray byte is one character rather than lost
      cp = 0xFFFD;
      p = pos + 1;
    }
    *next = p;
    return is_unicode_letter(cp)       ? kLetter
           : is_unicode_number(cp)     ? kNumber
           : is_unicode_whitespace(cp) ? kSpace
                                       : kOther;
  };
  size_t k = 0;
  while (k < n) {
    // 's|'t|'re|'ve|'m|'ll|'d, lowercase as GPT-2's pattern has them (ASCII bytes: never inside a longer character)
    if (text[k] == '\'' && k + 1 < n) {
      const char a = text[k + 1];
      const char b = k + 2 < n ? text[k + 2] : '\0';
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        len = 2;
      } else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        len = 3;
      }
      if (len > 0) {
        emit(text.substr(k, len));
        k += len;
        continue;
      }
    }
    // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space (U+0020 only), then a run of one class.
    const size_t s = text[k] == ' ' ? k + 1 : k;
    size_t j = 0;
    const Class c = class_at(s, &j);
    if (c == kLetter || c == kNumber || c == kOther) {
      for (size_t next = 0; j < n && class_at(j, &next) == c;) j = next;
      emit(text.substr(k, j - k));
      k = j;
      continue;
    }
    // Whitespace (text[k] is): '\s+(?!\S)' takes the run but its last character when a non-space follows (that one
    // goes with the next piece, as ' word' does), '\s+' a single one.
    size_t last = k;  // where the run's last character starts
    size_t count = 0;
    for (size_t next = 0, at = k; at < n && class_at(at, &next) == kSpace; at = next) {
      last = at;
      j = next;
      ++count;
    }
    const size_t end = j == n || count == 1 ? j : last;
    emit(text.substr(k, end - k));
    k = end;
  }
}

std::vector<std::string_view> gpt2_pieces(std::string_view text) {
  std::vector<std::string_view> pieces;
  each_gpt2_piece(text, [&](std::string_view piece) { pieces.push_back(piece); });
  return pieces;
}

Expected<BpeVocab> BpeVocab::create(const std::vector<std::string>& tokens,
                                    const std::vector<std::pair<std::string, std::string>>& merges,
                                    const std::vector<int32_t>& specials) {
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
  // Every token of two bytes or more is some merge's result, but for the special ones.
  std::vector<bool> made(v.bytes_.size(), false);
  for (const auto& [key, merge] : v.merges_) made[static_cast<size_t>(merge.result)] = true;
  for (const int32_t id : specials) {
    if (id >= 0 && id < v.size()) made[static_cast<size_t>(id)] = true;
  }
  size_t unmade = 0;
  int32_t first = -1;
  for (size_t id = 0; id < v.bytes_.size(); ++id) {
    if (v.bytes_[id].size() < 2) continue;
    if (!made[id]) {
      ++unmade;
      if (first < 0) first = static_cast<int32_t>(id);
    } else if (std::find(specials.begin(), specials.end(), static_cast<int32_t>(id)) != specials.end()) {
      v.specials_.push_back(static_cast<int32_t>(id));
    }
  }
  if (unmade > 0) {
    return Status::corruption(std::to_string(unmade) + " token(s) of " + std::to_string(v.size()) +
                              " are made by no merge (the first: '" + tokens[static_cast<size_t>(first)] + "', id " +
                              std::to_string(first) + "), with " + std::to_string(merges.size()) +
                              " merges: is the merges list cut short? (Only special tokens, listed in tokenizer.json's "
                              "added_tokens or written <|...|>, need no merge.)");
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
  const auto n = static_cast<int64_t>(piece.size());
  if (n == 0) return;
  std::vector<int32_t> id(static_cast<size_t>(n));
  std::vector<int64_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    id[static_cast<size_t>(i)] = byte_ids_[static_cast<uint8_t>(piece[static_cast<size_t>(i)])];
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < n ? i + 1 : -1;
  }
  // Candidates (rank, position of the pair's left token, the two ids), lowest rank first, then leftmost. An entry
  // whose tokens have merged since is stale and skipped.
  struct Candidate {
    int64_t rank, pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int64_t pos) {
    if (pos < 0) return;
    const int64_t nx = next[static_cast<size_t>(pos)];
    if (nx < 0) return;
    const auto it = merges_.find(pair_key(id[static_cast<size_t>(pos)], id[static_cast<size_t>(nx)]));
    if (it != merges_.end()) {
      heap.push({it->second.rank, pos, id[static_cast<size_t>(pos)], id[static_cast<size_t>(nx)]});
    }
  };
  for (int64_t i = 0; i + 1 < n; ++i) consider(i);
  std::vector<bool> gone(static_cast<size_t>(n), false);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto p = static_cast<size_t>(c.pos);
    const int64_t nx = next[p];
    if (gone[p] || nx < 0 || id[p] != c.left || id[static_cast<size_t>(nx)] != c.right) continue;
    id[p] = merges_.at(pair_key(c.left, c.right)).result;
    gone[static_cast<size_t>(nx)] = true;
    next[p] = next[static_cast<size_t>(nx)];
    if (next[p] >= 0) prev[static_cast<size_t>(next[p])] = c.pos;
    consider(prev[p]);
    consider(c.pos);
  }
  for (int64_t i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    ids->push_back(static_cast<uint16_t>(id[static_cast<size_t>(i)]));
}

void BpeVocab::encode_chunk(std::string_view text, std::vector<uint16_t>* ids) const {
  // Pieces repeat (" the", " and"): each distinct one is merged once per chunk.
  std::unordered_map<std::string_view, std::vector<uint16_t>> cache;
  std::vector<uint16_t> one;
  each_gpt2_piece(text, [&](std::string_view piece) {
    auto it = cache.find(piece);
    if (it == cache.end()) {
      one.clear();
      encode_piece(piece, &one);
      it = cache.emplace(piece, one).first;
    }
    ids->insert(ids->end(), it->second.begin(), it->second.end());
  });
}

std::vector<size_t> BpeVocab::chunk_starts(std::string_view text, size_t chunk_bytes) {
  // A '\n' between two printable ASCII characters is always a piece of its own: the piece before it ends at it (no
  // class but whitespace takes it, and the character before is not whitespace), and so does it (whitespace followed
  // by a non-space character is `\s+` alone). Cut just before one, each chunk's pieces are the whole text's.
  const auto printable = [&](size_t i) { return text[i] > 0x20 && text[i] < 0x7F; };
  std::vector<size_t> starts = {0};
  for (size_t at = chunk_bytes; at < text.size(); at = std::max(at, starts.back()) + chunk_bytes) {
    for (size_t nl = text.find('\n', at); nl != std::string_view::npos && nl < at + chunk_bytes;
         nl = text.find('\n', nl + 1)) {
      if (nl > 0 && nl + 1 < text.size() && printable(nl - 1) && printable(nl + 1)) {
        starts.push_back(nl);
        break;
      }
    }
  }
  starts.push_back(text.size());
  return starts;
}

void BpeVocab::encode(std::string_view text, std::vector<uint16_t>* ids) const {
  // A long text (prepare's corpus) in chunks on every thread, cut where the pieces do not change (chunk_starts):
  // about 8 a thread (each merges its own distinct pieces again, so fewer, larger ones on fewer threads), 256 KB at
  // least. The ids do not depend on where the cuts fall.
  const size_t per_chunk =
      std::max(size_t{256} << 10, text.size() / (8 * static_cast<size_t>(std::max(1, omp_get_max_threads()))));
  const std::vector<size_t> starts = chunk_starts(text, per_chunk);
  if (starts.size() <= 2) {
    encode_chunk(text, ids);
    return;
  }
  const auto chunks = static_cast<int64_t>(starts.size() - 1);
  std::vector<std::vector<uint16_t>> parts(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const auto k = static_cast<size_t>(c);
    encode_chunk(text.substr(starts[k], starts[k + 1] - starts[k]), &parts[k]);
  }
  size_t total = ids->size();
  for (const auto& part : parts) total += part.size();
  ids->reserve(total);
  for (const auto& part : parts) ids->insert(ids->end(), part.begin(), part.end());
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
  out += "],\n\"special\":[";
  for (size_t i = 0; i < specials_.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(specials_[i]);
  }
  return out + "]}\n";
}

std::string BpeVocab::vocab_json() const {
  std::string out = "{";
  for (size_t i = 0; i < bytes_.size(); ++i) {
    out += i == 0 ? "\"" : ", \"";
    append_files_form(bytes_[i], &out);
    out += "\": " + std::to_string(i);
  }
  return out + "}\n";
}

std::string BpeVocab::merges_txt() const {
  std::string out = "#version: 0.2\n";
  for (const auto& [left, right] : merge_list_) {
    append_files_form(bytes_[static_cast<size_t>(left)], &out);
    out += ' ';
    append_files_form(bytes_[static_cast<size_t>(right)], &out);
    out += '\n';
  }
  return out;
}

}  // namespace gpt::data
