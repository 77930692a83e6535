#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "apps/commands.h"
#include "comm/communicator.h"
#include "config/loader.h"
#include "config/schema.h"
#include "core/atomic_file.h"
#include "core/logging.h"
#include "core/stop_signal.h"
#include "core/test_fault.h"
#include "embedded_config.h"
#include "train/trainer.h"

namespace gpt {

namespace {
struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  bool help_config = false;
  std::string resume;
  std::string stop_marker;
};
}  // namespace

namespace {
// --stop-marker at the start (rank 0): a marker an earlier run left is removed, and a directory it cannot be
// written into is an error now, not after the checkpoint the marker was to announce.
Status clear_stop_marker(const std::string& path) {
  if (std::remove(path.c_str()) != 0 && errno != ENOENT) {
    return Status::io_error("--stop-marker: cannot remove '" + path +
                            "' left by an earlier run: " + std::strerror(errno));
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  const std::string where = dir.empty() ? "." : dir.string();
  if (access(where.c_str(), W_OK) != 0) {
    return Status::io_error("--stop-marker " + path + ": cannot write into '" + where + "': " + std::strerror(errno));
  }
  return Status::ok();
}
}  // namespace

Expected<RunConfig> load_config_arg(const std::string& path, const std::vector<std::string>& overrides) {
  return path.empty() ? load_run_config_text(kEmbeddedConfig, kEmbeddedConfigName, overrides)
                      : load_run_config_file(path, overrides);
}

Command add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  app.add_option("--config,-c", args->config, "YAML run config (default: the built-in configs/quickstart.yaml)");
  app.add_option("--set", args->overrides, "Override a config key, e.g. --set training.steps=100 (repeatable)")
      ->type_name("KEY=VALUE");
  app.add_option("--resume", args->resume,
                 "Continue from a checkpoint: 'auto' (<checkpoint.dir>/latest, if any), a step directory saved at "
                 "any world size and strategy, or a checkpoint root (its latest) (sets checkpoint.resume)")
      ->type_name("auto|DIR");
  app.add_option("--stop-marker", args->stop_marker,
                 "A file rank 0 removes at the start and writes when a signal stops the run early, after its "
                 "checkpoint: the sbatch templates requeue the job only then (not after a run that finished)")
      ->type_name("FILE");
  app.add_flag("--help-config", args->help_config, "Print every config key with its type, default and meaning");
  app.footer(
      "Examples:\n"
      "  gpt-train train                                   # built-in quickstart config\n"
      "  gpt-train train --config configs/shakespeare-char-cpu.yaml\n"
      "  gpt-train train -c configs/shakespeare-char-cpu.yaml --set training.steps=200 --set run.threads=2\n"
      "  gpt-train train -c configs/shakespeare-char-cpu.yaml --set checkpoint.every=500 --resume auto\n"
      "  mpirun -np 4 gpt-train train -c my.yaml --resume runs/my/checkpoints/step_00001000\n"
      "  gpt-train train --help-config");
  return [args]() -> int {
    if (args->help_config) {
      std::cout << config_reference_text();
      return 0;
    }
    std::vector<std::string> overrides = args->overrides;
    if (!args->resume.empty()) overrides.push_back("checkpoint.resume=" + args->resume);
    Expected<RunConfig> cfg = load_config_arg(args->config, overrides);
    if (!cfg) return report_error(cfg.status());
    if (!args->resume.empty()) cfg->origin["checkpoint.resume"] = "--resume " + args->resume;  // as the user wrote it
    init_logging(world().rank(), cfg->logging.level);
    spdlog::info("resolved config ({}):\n{}", args->config.empty() ? kEmbeddedConfigName : args->config, to_yaml(*cfg));
    start_comm_watchdog(cfg->comm.timeout_s, cfg->comm.save_timeout_s);
    const bool marks = !args->stop_marker.empty() && world().rank() == 0;
    if (marks) {
      if (Status st = clear_stop_marker(args->stop_marker); !st.is_ok()) return report_error(st);
    }
    // Armed before the start-up (data, restore, NCCL), which can take minutes: a signal then stops the run after
    // its first step, with a checkpoint, instead of killing it.
    arm_stop_signals();  // SIGUSR1/SIGTERM/SIGINT: checkpoint after the current step, exit 0
    if (const auto fault = test_fault(); fault && fault->is("slow_start", 1)) {  // a start-up that takes a while
      spdlog::info("slow_start: holding the start-up {} ms (stop signals armed)", fault->args[0]);
      std::this_thread::sleep_for(std::chrono::milliseconds(fault->args[0]));
    }
    auto trainer = Trainer::create(*cfg, world(), ranks_per_node(), local_rank());
    if (!trainer && args->config.empty() &&
        trainer.status().message().find("data/fortunes") != std::string::npos) {  // its data is missing
      return report_error(trainer.status().with_context(
          "the built-in quickstart config trains on data/fortunes, which scripts/setup.sh prepares"));
    }
    if (!trainer) return report_error(trainer.status());
    auto summary = (*trainer)->run();
    if (!summary) return report_error(summary.status());
    if (marks && summary->interrupted) {
      const std::string text =
          "stopped early by a signal after its checkpoint was saved; --resume auto continues from it\n";
      const Status st = write_file_atomically(args->stop_marker, {std::span<const char>(text)});
      if (!st.is_ok()) return report_error(st.with_context("--stop-marker"));
    }
    return 0;
  };
}

}  // namespace gpt
