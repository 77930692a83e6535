// A strict JSON reader (RFC 8259) for the JSON files gpt-train reads: tokenizer files (Hugging Face's
// tokenizer.json, vocab.json, OpenAI's encoder.json), Hugging Face's config.json and safetensors headers.
//
// yaml-cpp read these before (JSON is nearly YAML), but it took about 0.4 s and 60 MB for GPT-2's 50,257-token
// vocabulary, and YAML's leniency let through what no JSON writer makes: `0x10` as a number, anchors, a key given
// twice (the first won). Here a file is JSON or an error naming the line and column: a duplicate key, a number
// with a leading zero or a hexadecimal one, a bare word, an unescaped control character, invalid UTF-8, a lone
// surrogate escape, trailing text, nesting deeper than 512.
//
//   Expected<json::Value> v = json::parse(text);
//   if (const json::Value* m = v->find("model"); m && m->is_object()) ...
//   for (size_t i = 0; i < obj.size(); ++i) use(obj.key(i), obj.item(i));   // an object's members in file order
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gpt::json {

enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

// "null", "a boolean", "a number", "a string", "a list", "an object": for messages.
const char* type_name(Type t);

class Value {
 public:
  Value() = default;

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }

  // A string's contents (UTF-8), or a number's literal text as written ("1e-05"); "" otherwise.
  const std::string& text() const { return text_; }
  bool boolean() const { return boolean_; }
  // A number written as an integer (no fraction or exponent) that fits int64; none otherwise.
  std::optional<int64_t> as_int64() const;
  // Any number as a double (finite: JSON has no others, and one too large for a double is none).
  std::optional<double> as_double() const;

  // Arrays: the elements; objects: the members' values (key(i) is member i's key). Both in file order.
  size_t size() const { return items_.size(); }
  const Value& item(size_t i) const { return items_[i]; }
  const std::vector<Value>& items() const { return items_; }
  const std::string& key(size_t i) const { return keys_[i]; }
  // An object's member by key (keys are unique); null when absent or when this is not an object.
  const Value* find(std::string_view key) const;

 private:
  friend class Parser;
  Type type_ = Type::kNull;
  bool boolean_ = false;
  std::string text_;
  std::vector<std::string> keys_;  // objects only, parallel to items_
  std::vector<Value> items_;
};

// The value `text` holds. An error says "line L, column C: " (1-based, the column in bytes) and what was expected.
Expected<Value> parse(std::string_view text);

}  // namespace gpt::json
