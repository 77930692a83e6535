#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"gpt-train: train GPT language models"};
  app.set_version_flag("--version", GPT_VERSION);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
