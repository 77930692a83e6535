// The Unicode classes of GPT-2's pre-tokenizer pattern (bpe.h): \p{L}, \p{N} and \s.
#pragma once

namespace gpt::data {

// \p{L} (letters) and \p{N} (numbers) as Python's `regex` module reads them (the tables in unicode_classes.cc are
// generated from it by scripts/reference/gen_unicode_classes.py).
bool is_unicode_letter(char32_t cp);
bool is_unicode_number(char32_t cp);

// \s: Unicode's White_Space property (25 code points), as `regex` and Rust's regex read it.
constexpr bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

}  // namespace gpt::data
