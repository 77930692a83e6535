// Loading a RunConfig: a YAML file (one map per section, see config_reference_text()), then `--set
// section.key=value` overrides in order, then validation (each key's allowed values, then rules across keys).
// The result is fully validated, and its `origin` names where every non-default key came from:
// "file:line:column" (1-based, the value's position) or "--set section.key=value".
//
// Every error is Status::invalid_argument, and its message starts with that place and names the full key and
// what was expected, e.g. "configs/x.yaml:3:3: unknown key 'model.n_hed'; did you mean 'model.n_head'?".
// Nothing outside config/ reads YAML.
#pragma once

#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/status.h"

namespace gpt {

// Reads the file at `path` (errors name `path` as given).
Expected<RunConfig> load_run_config_file(const std::string& path, const std::vector<std::string>& overrides);

// The same from YAML text; `source_name` stands for the file in positions ("<builtin>", a test's name).
// Empty text is an empty config: all defaults.
Expected<RunConfig> load_run_config_text(const std::string& yaml_text, const std::string& source_name,
                                         const std::vector<std::string>& overrides);

// The resolved config as YAML: every key of every section, which load_run_config_text reads back to a
// config with the same values.
std::string to_yaml(const RunConfig& cfg);

}  // namespace gpt
