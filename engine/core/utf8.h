// UTF-8 helpers for the tokenizers and the JSON reader: strict decoding (no overlong forms, no surrogates, nothing
// past U+10FFFF), encoding, and a printable description of a code point for error messages.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gpt {

// Decodes the code point starting at s[*pos] into *cp and advances *pos past it. Returns false, leaving
// *pos at the offending byte, when the bytes there are not valid UTF-8. REQUIRES: *pos < s.size().
bool decode_utf8(std::string_view s, size_t* pos, char32_t* cp);

// The offset of the first byte of `s` that does not start a valid UTF-8 character, or npos when all of it is valid.
size_t invalid_utf8_offset(std::string_view s);

// Appends the UTF-8 encoding of `cp`. REQUIRES: cp is a valid code point (not a surrogate, <= U+10FFFF).
void append_utf8(char32_t cp, std::string* out);

// Appends `cp` as it goes inside a JSON string literal: '"', '\\' and control characters escaped, and so are the
// characters YAML 1.1 reads as line breaks or a BOM (C1 controls incl. NEL, U+2028, U+2029, U+FEFF): gpt-train read
// tokenizer files with yaml-cpp before its JSON reader (core/json.h), and other YAML readers may still read them.
void append_json_escaped(char32_t cp, std::string* out);

// "'a' (U+0061)", or "U+000A" alone for characters that do not print.
std::string describe_code_point(char32_t cp);

}  // namespace gpt
