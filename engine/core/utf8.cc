#include "core/utf8.h"

#include <cstdint>
#include <cstdio>

namespace gpt {

bool decode_utf8(std::string_view s, size_t* pos, char32_t* cp) {
  const size_t i = *pos;
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  size_t len;
  char32_t min_cp, value;
  if (b0 < 0x80) {
    *cp = b0;
    *pos = i + 1;
    return true;
  } else if ((b0 & 0xE0) == 0xC0) {
    len = 2, min_cp = 0x80, value = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min_cp = 0x800, value = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min_cp = 0x10000, value = b0 & 0x07;
  } else {
    return false;  // a continuation byte or 0xF8..0xFF where a sequence should start
  }
  if (i + len > s.size()) return false;  // truncated sequence
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return false;
    value = (value << 6) | (byte(i + k) & 0x3F);
  }
  if (value < min_cp || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) return false;
  *cp = value;
  *pos = i + len;
  return true;
}

void append_utf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string describe_code_point(char32_t cp) {
  char hex[16];
  std::snprintf(hex, sizeof(hex), "U+%04X", static_cast<unsigned>(cp));
  if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) return hex;
  std::string s = "'";
  append_utf8(cp, &s);
  return s + "' (" + hex + ")";
}

size_t invalid_utf8_offset(std::string_view s) {
  char32_t cp = 0;
  for (size_t pos = 0; pos < s.size();) {
    if (!decode_utf8(s, &pos, &cp)) return pos;
  }
  return std::string_view::npos;
}

void append_json_escaped(char32_t cp, std::string* out) {
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
}

}  // namespace gpt
