// gpt-train: the command-line entry point. Subcommands: train, prepare, sample.
#include <spdlog/spdlog.h>

#include <map>

#include "apps/commands.h"
#include "core/logging.h"

namespace gpt {

int report_error(const Status& status) {
  spdlog::error("{}", status.message());
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruption:
    case StatusCode::kFailedPrecondition: return 2;
    default: return 1;
  }
}

}  // namespace gpt

int main(int argc, char** argv) {
  gpt::init_logging(0);
  CLI::App app{"gpt-train: train GPT language models on a CPU (and, later, GPUs and clusters)"};
  app.set_version_flag("--version", std::string("gpt-train ") + GPT_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  gpt-train prepare --input ../shared/data/tinyshakespeare.txt --out data/shakespeare_char\n"
      "  gpt-train train --config configs/shakespeare-char-cpu.yaml\n"
      "  gpt-train sample --run runs/shakespeare-char --prompt 'ROMEO:' --tokens 300\n"
      "Run 'gpt-train SUBCOMMAND --help' for a subcommand's options.");
  std::map<CLI::App*, gpt::Command> commands;
  CLI::App* train = app.add_subcommand("train", "Train a model from a YAML run config");
  commands[train] = gpt::add_train_command(*train);
  CLI::App* prepare = app.add_subcommand("prepare", "Tokenize text files into train/val token shards");
  commands[prepare] = gpt::add_prepare_command(*prepare);
  CLI::App* sample = app.add_subcommand("sample", "Generate text from a trained model");
  commands[sample] = gpt::add_sample_command(*sample);
  CLI11_PARSE(app, argc, argv);
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  return 0;
}
