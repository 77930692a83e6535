// Validation of a RunConfig: every key's allowed values (from the schema), then the rules between keys
// (n_embd divisible by n_head, global batch a multiple of the micro-batch, min_lr <= lr, ...). The loader
// runs it after overrides; code that builds a RunConfig by hand can run it too.
#pragma once

#include <string>

#include "config/run_config.h"
#include "core/status.h"

namespace gpt {

// Errors are Status::invalid_argument placed with cfg.origin ("x.yaml:4:12: model.n_embd: ..."), or with
// `source_name` when the keys involved were left at their defaults.
Status validate_run_config(const RunConfig& cfg, const std::string& source_name);

}  // namespace gpt
