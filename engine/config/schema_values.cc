// The value half of the schema (declared in schema.h): reading a key's text into its field, checking it
// against the key's allowed values, and writing it back as text.
#include <charconv>
#include <cmath>
#include <type_traits>

#include "config/schema.h"

namespace gpt {
namespace {

// Shortest text that reads back to the same value ("0.001", "1e-08", "-1").
template <typename T>
std::string format_number(T v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, ptr) : std::string("?");
}

template <typename T>
Status parse_integer(const KeySpec& spec, std::string_view text, T* out) {
  std::string_view digits = text;
  if (digits.starts_with('+') && !digits.starts_with("+-")) digits.remove_prefix(1);
  T v{};
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  const bool whole = ptr == digits.data() + digits.size() && !digits.empty();
  if (ec == std::errc::result_out_of_range) {
    return Status::invalid_argument(std::string(spec.key) + ": integer out of range for " +
                                    std::string(type_name(spec)) + ", got '" + std::string(text) + "'");
  }
  if (ec != std::errc() || !whole) {
    const char* what = std::is_unsigned_v<T> ? "a non-negative integer" : "an integer";
    return Status::invalid_argument(std::string(spec.key) + ": expected " + what + ", got '" + std::string(text) + "'");
  }
  *out = v;
  return Status::ok();
}

Status parse_float(const KeySpec& spec, std::string_view text, float* out) {
  std::string_view digits = text;
  if (digits.starts_with('+') && !digits.starts_with("+-")) digits.remove_prefix(1);
  float v = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec == std::errc() && ptr == digits.data() + digits.size() && !digits.empty() && std::isfinite(v)) {
    *out = v;
    return Status::ok();
  }
  const char* what = ec == std::errc::result_out_of_range ? "a number within float range" : "a finite number";
  return Status::invalid_argument(std::string(spec.key) + ": expected " + what + ", got '" + std::string(text) + "'");
}

Status parse_bool(const KeySpec& spec, std::string_view text, bool* out) {
  if (text == "true" || text == "True" || text == "TRUE") {
    *out = true;
  } else if (text == "false" || text == "False" || text == "FALSE") {
    *out = false;
  } else {
    return Status::invalid_argument(std::string(spec.key) + ": expected true or false, got '" + std::string(text) +
                                    "'");
  }
  return Status::ok();
}

}  // namespace

std::string allowed_text(const KeySpec& spec) {
  const Allowed& a = spec.allowed;
  if (a.check) return std::string(a.check_text);
  if (!a.choices.empty()) return std::string(a.choices);
  if (a.non_empty) return "non-empty";
  if (a.min && a.max) {
    return std::string(a.min_exclusive ? "(" : "[") + format_number(*a.min) + ", " + format_number(*a.max) +
           (a.max_exclusive ? ")" : "]");
  }
  if (a.min) return (a.min_exclusive ? "> " : ">= ") + format_number(*a.min);
  if (a.max) return (a.max_exclusive ? "< " : "<= ") + format_number(*a.max);
  return "";
}

Status parse_value(const KeySpec& spec, std::optional<std::string_view> text, RunConfig* cfg) {
  FieldRef f = spec.field(*cfg);
  if (auto* s = std::get_if<std::string*>(&f)) {
    **s = text ? std::string(*text) : std::string();
    return Status::ok();
  }
  if (!text) {
    return Status::invalid_argument(std::string(spec.key) + ": expected a value of type " +
                                    std::string(type_name(spec)) + ", got nothing (null)");
  }
  return std::visit(
      [&](auto* p) -> Status {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          return parse_bool(spec, *text, p);
        } else if constexpr (std::is_same_v<T, float>) {
          return parse_float(spec, *text, p);
        } else if constexpr (std::is_integral_v<T>) {
          return parse_integer(spec, *text, p);
        } else {
          return Status::ok();  // strings handled above
        }
      },
      f);
}

Status check_allowed(const KeySpec& spec, const RunConfig& cfg) {
  const Allowed& a = spec.allowed;
  const std::string value = format_value(spec, cfg);
  auto fail = [&](const std::string& why) { return Status::invalid_argument(std::string(spec.key) + ": " + why); };
  if (a.check) {
    const std::string why = a.check(value);
    return why.empty() ? Status::ok() : fail(why);
  }
  if (!a.choices.empty()) {
    std::string_view rest = a.choices;
    while (!rest.empty()) {
      const size_t bar = rest.find('|');
      if (rest.substr(0, bar) == value) return Status::ok();
      rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
    }
    return fail("expected one of " + std::string(a.choices) + ", got '" + value + "'");
  }
  if (a.non_empty && value.empty()) return fail("must not be empty");
  if (a.min || a.max) {
    const double v = std::visit(
        [](auto* p) -> double {
          if constexpr (std::is_arithmetic_v<std::remove_pointer_t<decltype(p)>>) return static_cast<double>(*p);
          return 0;
        },
        spec.field(const_cast<RunConfig&>(cfg)));
    const bool low = a.min && (a.min_exclusive ? v <= *a.min : v < *a.min);
    const bool high = a.max && (a.max_exclusive ? v >= *a.max : v > *a.max);
    if (low || high) {
      const std::string range = allowed_text(spec);
      return fail((a.min && a.max ? "must be in " : "must be ") + range + ", got " + value);
    }
  }
  return Status::ok();
}

std::string format_value(const KeySpec& spec, const RunConfig& cfg) {
  // The accessor only takes the address of a field; the value is only read here.
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return *p;
        } else if constexpr (std::is_same_v<T, bool>) {
          return *p ? "true" : "false";
        } else if constexpr (std::is_same_v<T, float>) {
          return format_number(*p);
        } else {
          return std::to_string(*p);
        }
      },
      spec.field(const_cast<RunConfig&>(cfg)));
}

bool config_values_equal(const RunConfig& a, const RunConfig& b) {
  for (const KeySpec& s : config_schema()) {
    const bool same = std::visit(
        [&](auto* pa) {
          using P = decltype(pa);
          return *pa == *std::get<P>(s.field(const_cast<RunConfig&>(b)));
        },
        s.field(const_cast<RunConfig&>(a)));
    if (!same) return false;
  }
  return true;
}

}  // namespace gpt
