#include "core/json.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/utf8.h"

namespace gpt::json {

const char* type_name(Type t) {
  switch (t) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "a boolean";
    case Type::kNumber:
      return "a number";
    case Type::kString:
      return "a string";
    case Type::kArray:
      return "a list";
    case Type::kObject:
      return "an object";
  }
  return "?";
}

std::optional<int64_t> Value::as_int64() const {
  if (type_ != Type::kNumber || text_.find_first_of(".eE") != std::string::npos) return std::nullopt;
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text_.data(), text_.data() + text_.size(), v);
  if (ec != std::errc() || end != text_.data() + text_.size()) return std::nullopt;
  return v;
}

std::optional<double> Value::as_double() const {
  if (type_ != Type::kNumber) return std::nullopt;
  errno = 0;
  const double v = std::strtod(text_.c_str(), nullptr);  // the grammar was checked: the whole text is the number
  if (errno == ERANGE && std::isinf(v)) return std::nullopt;
  return v;
}

const Value* Value::find(std::string_view key) const {
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (keys_[i] == key) return &items_[i];
  }
  return nullptr;
}

namespace {

constexpr int kMaxDepth = 512;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  Expected<Value> run() {
    if (s_.starts_with("\xEF\xBB\xBF")) pos_ = 3;  // a byte order mark, as some editors write
    Value v;
    if (!value(&v, 0)) return error_status();
    skip_space();
    if (pos_ != s_.size()) {
      fail("text after the JSON value");
      return error_status();
    }
    return v;
  }

 private:
  bool fail(std::string what) {
    if (error_.empty()) {
      error_ = std::move(what);
      error_pos_ = pos_;
    }
    return false;
  }

  // "line L, column C" of byte `pos` (1-based; the column in bytes).
  std::string where(size_t pos) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column);
  }

  Status error_status() const { return Status::corruption("not valid JSON: " + where(error_pos_) + ": " + error_); }

  // What is at pos_, for messages: the character, or the end.
  std::string found() const {
    if (pos_ >= s_.size()) return "the end of the text";
    const unsigned char c = static_cast<unsigned char>(s_[pos_]);
    if (c < 0x20 || c >= 0x7F) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "byte 0x%02X", c);
      return buf;
    }
    return std::string("'") + static_cast<char>(c) + "'";
  }

  void skip_space() {
    while (pos_ < s_.size() && is_space(s_[pos_])) ++pos_;
  }

  bool value(Value* v, int depth) {
    skip_space();
    if (pos_ >= s_.size()) return fail("expected a value, found the end of the text");
    switch (s_[pos_]) {
      case '{':
        return object(v, depth);
      case '[':
        return array(v, depth);
      case '"':
        v->type_ = Type::kString;
        return string(&v->text_);
      case 't':
        return literal(v, "true", Type::kBool, true);
      case 'f':
        return literal(v, "false", Type::kBool, false);
      case 'n':
        return literal(v, "null", Type::kNull, false);
      default:
        if (s_[pos_] == '-' || is_digit(s_[pos_])) return number(v);
        return fail("expected a value (an object, list, string, number, true, false or null), found " + found());
    }
  }

  bool literal(Value* v, std::string_view word, Type type, bool b) {
    if (s_.substr(pos_, word.size()) != word) return fail("expected a value, found " + found());
    pos_ += word.size();
    v->type_ = type;
    v->boolean_ = b;
    return true;
  }

  bool number(Value* v) {
    const size_t begin = pos_;
    if (s_[pos_] == '-') ++pos_;
    if (pos_ >= s_.size() || !is_digit(s_[pos_])) return fail("expected a digit after '-', found " + found());
    if (s_[pos_] == '0') {
      ++pos_;
      if (pos_ < s_.size() && (is_digit(s_[pos_]) || s_[pos_] == 'x' || s_[pos_] == 'X')) {
        return fail("a number may not start with 0 unless it is 0 (no leading zeros, no hexadecimal)");
      }
    } else {
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    }
    if (pos_ < s_.size() && s_[pos_] == '.') {
      ++pos_;
      if (pos_ >= s_.size() || !is_digit(s_[pos_])) return fail("expected a digit after '.', found " + found());
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      if (pos_ >= s_.size() || !is_digit(s_[pos_])) return fail("expected an exponent's digits, found " + found());
      while (pos_ < s_.size() && is_digit(s_[pos_])) ++pos_;
    }
    v->type_ = Type::kNumber;
    v->text_.assign(s_.substr(begin, pos_ - begin));
    return true;
  }

  bool hex4(uint32_t* out) {
    if (pos_ + 4 > s_.size()) return fail("expected four hexadecimal digits after \\u");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex_value(s_[pos_]);
      if (h < 0) return fail("expected four hexadecimal digits after \\u, found " + found());
      v = v * 16 + static_cast<uint32_t>(h);
      ++pos_;
    }
    *out = v;
    return true;
  }

  // At the opening quote.
  bool string(std::string* out) {
    ++pos_;
    out->clear();
    while (true) {
      const size_t run = pos_;  // bytes that stand for themselves, appended at once
      while (pos_ < s_.size()) {
        const unsigned char c = static_cast<unsigned char>(s_[pos_]);
        if (c == '"' || c == '\\' || c < 0x20) break;
        if (c < 0x80) {
          ++pos_;
          continue;
        }
        char32_t cp = 0;
        if (!decode_utf8(s_, &pos_, &cp)) return fail("invalid UTF-8 in a string (" + found() + ")");
      }
      out->append(s_.substr(run, pos_ - run));
      if (pos_ >= s_.size()) return fail("a string is not closed (no '\"' before the end of the text)");
      const char c = s_[pos_];
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c != '\\') return fail("a control character (" + found() + ") in a string must be escaped");
      const size_t escape = pos_++;
      if (pos_ >= s_.size()) return fail("a string is not closed (no '\"' before the end of the text)");
      const char e = s_[pos_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          // A surrogate escape without its other half, named at its backslash.
          const auto lone = [&](const char* which) {
            pos_ = escape;
            return fail(std::string("a \\u escape of a ") + which);
          };
          uint32_t cp = 0;
          if (!hex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return lone("low surrogate without a high one before");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t lo = 0;
            if (s_.substr(pos_, 2) != "\\u") return lone("high surrogate without a low one after");
            pos_ += 2;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF) return lone("high surrogate without a low one after");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(static_cast<char32_t>(cp), out);
          break;
        }
        default:
          --pos_;
          return fail("unknown escape: '\\' then " + found() +
                      " in a string (JSON has \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
      }
    }
  }

  bool array(Value* v, int depth) {
    if (depth >= kMaxDepth) return fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    ++pos_;
    v->type_ = Type::kArray;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      ++pos_;
      return true;
    }
    while (true) {
      v->items_.emplace_back();
      if (!value(&v->items_.back(), depth + 1)) return false;
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        ++pos_;
        return true;
      }
      return fail("expected ',' or ']' in a list, found " + found());
    }
  }

  bool object(Value* v, int depth) {
    if (depth >= kMaxDepth) return fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    std::vector<size_t> key_at;  // where each key starts, for the message of one given twice
    ++pos_;
    v->type_ = Type::kObject;
    skip_space();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      ++pos_;
      return true;
    }
    while (true) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != '"') return fail("expected a member's key (a string), found " + found());
      key_at.push_back(pos_);
      v->keys_.emplace_back();
      if (!string(&v->keys_.back())) return false;
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != ':') return fail("expected ':' after a key, found " + found());
      ++pos_;
      v->items_.emplace_back();
      if (!value(&v->items_.back(), depth + 1)) return false;
      skip_space();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        ++pos_;
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        ++pos_;
        break;
      }
      return fail("expected ',' or '}' in an object, found " + found());
    }
    return unique_keys(*v, key_at);
  }

  // A key given twice is an error (readers disagree on which one wins): named where it comes again.
  bool unique_keys(const Value& v, const std::vector<size_t>& key_at) {
    std::vector<size_t> order(v.keys_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v.keys_[a] < v.keys_[b]; });
    // Of the keys given more than once, the one whose second time comes first in the text.
    size_t first = 0, again = order.size();
    for (size_t i = 1; i < order.size(); ++i) {
      const size_t a = order[i - 1], b = order[i];                          // stable: a < b
      const bool run_start = i < 2 || v.keys_[order[i - 2]] != v.keys_[a];  // b is the key's second time
      if (v.keys_[a] == v.keys_[b] && run_start && b < again) {
        first = a;
        again = b;
      }
    }
    if (again != order.size()) {
      std::string key;  // as JSON writes it
      for (const char c : std::string_view(v.keys_[first]).substr(0, 60)) {
        if (c == '"' || c == '\\') {
          key += '\\';
          key += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(c));
          key += buf;
        } else {
          key += c;
        }
      }
      if (v.keys_[first].size() > 60) key += "...";
      pos_ = key_at[again];
      return fail("the key \"" + key + "\" again (first at " + where(key_at[first]) +
                  "): an object's keys must differ");
    }
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
  size_t error_pos_ = 0;
};

Expected<Value> parse(std::string_view text) { return Parser(text).run(); }

}  // namespace gpt::json
