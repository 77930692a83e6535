// The subcommands of gpt-train. Each registers its options on the CLI11 app and, when run, returns the
// process exit code. apps/ is the only place that turns a Status into a message and an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "core/status.h"

namespace gpt {

using Command = std::function<int()>;

Command add_train_command(CLI::App& app);
Command add_prepare_command(CLI::App& app);
Command add_sample_command(CLI::App& app);

// Logs "error: <message>" and returns the exit code for a failed Status (2 for bad input, 1 otherwise).
int report_error(const Status& status);

}  // namespace gpt
