#include <spdlog/spdlog.h>

#include <iostream>
#include <memory>

#include "apps/commands.h"
#include "comm/communicator.h"
#include "config/loader.h"
#include "config/schema.h"
#include "core/logging.h"
#include "core/stop_signal.h"
#include "embedded_config.h"
#include "train/trainer.h"

namespace gpt {

namespace {
struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
  bool help_config = false;
  std::string resume;
};
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
                 "Continue from a checkpoint: 'auto' (<checkpoint.dir>/latest, if any) or a step directory saved at "
                 "any world size and strategy (sets checkpoint.resume)")
      ->type_name("auto|DIR");
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
    init_logging(world().rank(), cfg->logging.level);
    spdlog::info("resolved config ({}):\n{}", args->config.empty() ? kEmbeddedConfigName : args->config, to_yaml(*cfg));
    start_comm_watchdog(cfg->comm.timeout_s);
    auto trainer = Trainer::create(*cfg, world(), ranks_per_node(), local_rank());
    if (!trainer && args->config.empty()) {
      return report_error(trainer.status().with_context(
          "the built-in quickstart config trains on data/fortunes, which scripts/setup.sh prepares"));
    }
    if (!trainer) return report_error(trainer.status());
    arm_stop_signals();  // SIGUSR1/SIGTERM/SIGINT: checkpoint after the current step, exit 0
    auto summary = (*trainer)->run();
    if (!summary) return report_error(summary.status());
    return 0;
  };
}

}  // namespace gpt
