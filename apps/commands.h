// The subcommands of gpt-train. Each registers its options on the CLI11 app and, when run, returns the
// process exit code. apps/ is the only place that turns a Status into a message and an exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "config/run_config.h"
#include "core/status.h"

namespace gpt {

using Command = std::function<int()>;

Command add_train_command(CLI::App& app);
// The run config of --config PATH (or, when PATH is empty, the built-in configs/quickstart.yaml) with --set
// overrides applied.
Expected<RunConfig> load_config_arg(const std::string& path, const std::vector<std::string>& overrides);
Command add_prepare_command(CLI::App& app);
Command add_sample_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_checkpoint_command(CLI::App& app);

// Logs the error and returns its exit code (2 for bad input, 1 for I/O); in a multi-rank job it ends
// every rank instead (MPI_Abort) so that no rank waits forever in a collective.
int report_error(const Status& status);

// The world communicator: MPI's under mpirun or srun, and for `train`; otherwise a world of one without MPI.
class Communicator;
Communicator& world();
// Ranks of this job on this node (from MPI_Comm_split_type SHARED; 1 without MPI).
int ranks_per_node();
int local_rank();
// Starts the collective watchdog (comm.timeout_s; comm.save_timeout_s for the checkpoint writer's) over every MPI
// communicator. Collective.
void start_comm_watchdog(double timeout_s, double save_timeout_s);

}  // namespace gpt
