// Logging set-up: one spdlog logger whose every line carries the rank ("[rank 0]"). Only rank 0 logs
// progress at info level unless `all_ranks` is set; other ranks log warnings and errors.
#pragma once

#include <string>

namespace gpt {

// Installs the default logger. `level` is one of trace|debug|info|warn|error.
void init_logging(int rank, const std::string& level = "info", bool all_ranks = false);

// A warning through the default logger, for code nvcc compiles (fmt's compile-time format checks do not build
// there): the message as it is.
void log_warning(const std::string& message);
void log_info(const std::string& message);  // the same at info level

}  // namespace gpt
