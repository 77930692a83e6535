#include "config/loader.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "config/schema.h"
#include "config/validate.h"

namespace gpt {
namespace {

Status invalid(std::string msg) { return Status::invalid_argument(std::move(msg)); }

// "x.yaml:4:12" (yaml-cpp marks are 0-based); just the source when the mark is unknown.
std::string place(const std::string& source, const YAML::Mark& mark) {
  if (mark.is_null()) return source;
  return source + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

std::string kind_of(const YAML::Node& n) {
  if (n.IsMap()) return "a map";
  if (n.IsSequence()) return "a sequence";
  if (n.IsNull()) return "nothing (null)";
  return "'" + n.Scalar() + "'";
}

std::string section_list() {
  std::string out;
  for (std::string_view s : config_sections()) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

// "unknown key 'model.n_hed'; did you mean 'model.n_head'?", or the section's keys when nothing is close.
std::string unknown_key_message(const std::string& key) {
  std::string msg = "unknown key '" + key + "'";
  const std::string hint = suggest_config_key(key);
  if (!hint.empty()) return msg + "; did you mean '" + hint + "'?";
  const std::string section = key.substr(0, key.find('.'));
  if (key.find('.') == std::string::npos || section_meaning(section).empty()) {
    return msg + "; keys are section.key, sections are " + section_list();
  }
  std::string names;
  for (const KeySpec& s : config_schema()) {
    if (s.section == section) names += (names.empty() ? "" : ", ") + std::string(s.name);
  }
  return msg + "; " + section + " keys are " + names;
}

// Sets `spec` from one YAML value; errors start with the key.
Status apply_value(const KeySpec& spec, const YAML::Node& value, RunConfig* cfg) {
  if (value.IsMap() || value.IsSequence()) {
    return invalid(std::string(spec.key) + ": expected a single " + std::string(type_name(spec)) + " value, got " +
                   kind_of(value));
  }
  std::optional<std::string_view> text;
  if (!value.IsNull()) text = value.Scalar();
  return parse_value(spec, text, cfg);
}

Status apply_section(const std::string& section, const YAML::Node& body, const std::string& source,
                     std::map<std::string, std::string>* seen, RunConfig* cfg) {
  for (const auto& kv : body) {
    // Copies: a yaml-cpp iterator hands out a temporary pair (nodes are cheap handles).
    const YAML::Node k = kv.first;
    const YAML::Node v = kv.second;
    if (!k.IsScalar()) {
      return invalid(place(source, k.Mark()) + ": expected a key name in section '" + section + "', got " + kind_of(k));
    }
    const std::string key = section + "." + k.Scalar();
    const KeySpec* spec = find_config_key(key);
    if (spec == nullptr) return invalid(place(source, k.Mark()) + ": " + unknown_key_message(key));
    const std::string where = place(source, v.IsNull() ? k.Mark() : v.Mark());
    if (auto [first, fresh] = seen->emplace(key, where); !fresh) {
      return invalid(place(source, k.Mark()) + ": duplicate key '" + key + "' (first at " + first->second + ")");
    }
    Status st = apply_value(*spec, v, cfg);
    if (!st.is_ok()) return invalid(where + ": " + st.message());
    cfg->origin[key] = where;
  }
  return Status::ok();
}

Status apply_document(const YAML::Node& root, const std::string& source, RunConfig* cfg) {
  if (root.IsNull()) return Status::ok();
  if (!root.IsMap()) {
    return invalid(place(source, root.Mark()) + ": expected a map of sections (" + section_list() + "), got " +
                   kind_of(root));
  }
  std::map<std::string, std::string> seen_sections, seen_keys;
  for (const auto& kv : root) {
    const YAML::Node k = kv.first;
    const YAML::Node body = kv.second;
    if (!k.IsScalar()) return invalid(place(source, k.Mark()) + ": expected a section name, got " + kind_of(k));
    const std::string section = k.Scalar();
    if (section_meaning(section).empty()) {
      const std::string hint = suggest_config_section(section);
      return invalid(place(source, k.Mark()) + ": unknown section '" + section + "'" +
                     (hint.empty() ? "; sections are " + section_list() : "; did you mean '" + hint + "'?"));
    }
    if (auto [first, fresh] = seen_sections.emplace(section, place(source, k.Mark())); !fresh) {
      return invalid(place(source, k.Mark()) + ": duplicate section '" + section + "' (first at " + first->second +
                     ")");
    }
    if (body.IsNull()) continue;  // "model:" with nothing under it
    if (!body.IsMap()) {
      return invalid(place(source, body.Mark()) + ": section '" + section + "' must be a map of key: value, got " +
                     kind_of(body));
    }
    GPT_RETURN_IF_ERROR(apply_section(section, body, source, &seen_keys, cfg));
  }
  return Status::ok();
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// One `--set section.key=value`; errors start with "--set <arg>".
Status apply_override(const std::string& arg, RunConfig* cfg) {
  const std::string where = "--set " + arg;
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || trim(arg.substr(0, eq)).empty()) {
    std::string msg = where + ": expected section.key=value";
    const std::string hint = suggest_config_key(trim(arg));
    if (find_config_key(trim(arg)) != nullptr)
      msg += ", e.g. " + trim(arg) + "=...";
    else if (!hint.empty())
      msg += "; did you mean '" + hint + "=...'?";
    return invalid(msg);
  }
  const std::string key = trim(arg.substr(0, eq));
  const KeySpec* spec = find_config_key(key);
  if (spec == nullptr) return invalid(where + ": " + unknown_key_message(key));
  YAML::Node value;
  try {
    value = YAML::Load(arg.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    return invalid(where + ": " + key + ": value is not valid YAML: " + e.msg);
  }
  Status st = apply_value(*spec, value, cfg);
  if (!st.is_ok()) return invalid(where + ": " + st.message());
  cfg->origin[key] = where;
  return Status::ok();
}

// A YAML double-quoted string, so that any text (empty, "true", "a: #b", newlines) reads back unchanged.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

Expected<RunConfig> load_run_config_text(const std::string& yaml_text, const std::string& source_name,
                                         const std::vector<std::string>& overrides) {
  RunConfig cfg;
  try {
    YAML::Node root;
    try {
      // Every document, so that a second one (after a `---`) is an error rather than silently ignored.
      const std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
      for (size_t d = 1; d < docs.size(); ++d) {
        if (docs[d].IsNull()) continue;  // an empty one (a trailing '---')
        return invalid(place(source_name, docs[d].Mark()) +
                       ": a second YAML document (after '---'): a run config is one document; merge them or "
                       "remove the '---'");
      }
      if (!docs.empty()) root = docs[0];
    } catch (const YAML::ParserException& e) {
      return invalid(place(source_name, e.mark) + ": invalid YAML: " + e.msg);
    }
    GPT_RETURN_IF_ERROR(apply_document(root, source_name, &cfg));
  } catch (const YAML::Exception& e) {  // yaml-cpp throws on odd documents; never let it escape
    return invalid(place(source_name, e.mark) + ": " + e.msg);
  }
  for (const std::string& arg : overrides) GPT_RETURN_IF_ERROR(apply_override(arg, &cfg));
  GPT_RETURN_IF_ERROR(validate_run_config(cfg, source_name));
  return cfg;
}

Expected<RunConfig> load_run_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return invalid("cannot open config file '" + path + "': " + std::strerror(EISDIR));
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return invalid("cannot open config file '" + path + "': " + std::strerror(errno));
  std::string text;
  char buf[1 << 14];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f.get())) > 0) text.append(buf, n);
  if (std::ferror(f.get())) return invalid("cannot read config file '" + path + "': " + std::strerror(errno));
  // A file given on purpose that holds no document (empty, truncated, or only comments) would run every key at its
  // default, which is not what anyone who wrote a file meant. (A parse error is left to load_run_config_text, which
  // places it.)
  bool has_content = true;
  try {
    const std::vector<YAML::Node> docs = YAML::LoadAll(text);
    has_content = std::any_of(docs.begin(), docs.end(), [](const YAML::Node& d) { return !d.IsNull(); });
  } catch (const YAML::Exception&) {
  }
  if (!has_content) {
    return invalid(path + ": the config file holds no keys (it is empty, or only comments): write the run's keys " +
                   "there, or leave out --config for the built-in configs/quickstart.yaml");
  }
  return load_run_config_text(text, path, overrides);
}

std::string to_yaml(const RunConfig& cfg) {
  std::string out = "# gpt-train run config, resolved: every key, defaults included.\n";
  for (std::string_view section : config_sections()) {
    out += std::string(section) + ":\n";
    for (const KeySpec& spec : config_schema()) {
      if (spec.section != section) continue;
      const std::string v = format_value(spec, cfg);
      out += "  " + std::string(spec.name) + ": " + (type_name(spec) == "string" ? quoted(v) : v) + "\n";
    }
  }
  return out;
}

}  // namespace gpt
