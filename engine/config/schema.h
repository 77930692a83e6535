// The config schema: one table row per RunConfig key ("section.key"), giving its type, allowed values and
// meaning, and a pointer to the field it sets. Defaults are never written here: they are read from a
// default-constructed RunConfig, so the struct and the reference text cannot disagree. The loader, the
// validator, to_yaml and `gpt-train train --help-config` are all driven by this table, so adding a key is
// one field in run_config.h plus one row in schema.cc.
//
// Nothing here knows YAML: values arrive as scalar text (or "null"), errors are Statuses whose message
// starts with the full key ("training.lr: must be > 0, got -1"); callers put the place in front.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "config/run_config.h"
#include "core/status.h"

namespace gpt {

// The field a key sets, inside a particular RunConfig.
using FieldRef = std::variant<int*, int64_t*, uint64_t*, float*, bool*, std::string*>;

// What values a key accepts, beyond its type. Numeric bounds apply to numbers; `choices` ("a|b|c") and
// `non_empty` to strings; `check`, if set, runs last on the value's text form and returns the complaint
// (without the key) or "" when the value is fine.
struct Allowed {
  std::optional<double> min;
  bool min_exclusive = false;
  std::optional<double> max;
  bool max_exclusive = false;
  std::string_view choices;
  bool non_empty = false;
  std::string (*check)(const std::string& value) = nullptr;
  std::string_view check_text;  // how `check` is described in the reference ("none|full|selective|every:N")
};

struct KeySpec {
  std::string_view key;      // "model.n_head"
  std::string_view section;  // "model"
  std::string_view name;     // "n_head"
  FieldRef (*field)(RunConfig& cfg);
  Allowed allowed;
  std::string_view meaning;  // one line
};

// Every key, grouped by section in the order the sections appear in RunConfig.
std::span<const KeySpec> config_schema();
// The section names in order, and a one-line meaning for each.
std::span<const std::string_view> config_sections();
std::string_view section_meaning(std::string_view section);

// nullptr when `key` ("section.key") is not in the schema.
const KeySpec* find_config_key(std::string_view key);

// "int", "int64", "uint64", "float", "bool" or "string".
std::string_view type_name(const KeySpec& spec);
// The allowed values in words (">= 1", "[0, 1)", "random|sequential"), "" when any value of the type is.
std::string allowed_text(const KeySpec& spec);

// Sets spec's field in *cfg from a scalar's text; nullopt is a YAML null (an empty string for string keys,
// an error otherwise). Checks only the type (and that an integer fits); see check_allowed for the rest.
Status parse_value(const KeySpec& spec, std::optional<std::string_view> text, RunConfig* cfg);
// Error when cfg's value for spec is outside spec.allowed: "training.lr: must be > 0, got -1".
Status check_allowed(const KeySpec& spec, const RunConfig& cfg);
// The value as text that parse_value reads back to the same value (floats in shortest round-trip form).
std::string format_value(const KeySpec& spec, const RunConfig& cfg);

// True when every key has the same value in a and b (origins are not compared).
bool config_values_equal(const RunConfig& a, const RunConfig& b);

// For an unknown key or section: the closest valid name, or "" when nothing is close. For "model.lr" it
// also finds a key of the same name in another section ("training.lr"); a bare "n_head" gets "model.n_head".
std::string suggest_config_key(std::string_view unknown_key);
std::string suggest_config_section(std::string_view unknown_section);

// The reference for `gpt-train train --help-config`: every key by section with type, default, allowed
// values and meaning.
std::string config_reference_text();

}  // namespace gpt
