// gpt-train: the command-line entry point. Subcommands: train, prepare, sample, plan, checkpoint.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <map>
#include <new>

#include "apps/commands.h"
#include "comm/mpi_communicator.h"
#include "core/logging.h"
#include "core/stop_signal.h"

namespace gpt {

namespace {
MpiEnvironment* g_mpi = nullptr;
std::unique_ptr<Communicator> g_world;
}  // namespace

Communicator& world() { return *g_world; }
int ranks_per_node() { return g_mpi->local_size(); }
int local_rank() { return g_mpi->local_rank(); }
void start_comm_watchdog(double timeout_s, double save_timeout_s) { g_mpi->start_watchdog(timeout_s, save_timeout_s); }

// operator new's failure under several ranks: no unwinding (destructors on the way, NCCL's teardown or a communicator
// draining its queue, would wait for peers that go on), but a line without allocating, and the job ends. One process
// throws std::bad_alloc as usual, which main catches.
void on_out_of_memory() {
  static std::atomic<bool> reported{false};
  if (g_mpi == nullptr || g_mpi->world_size() == 1) throw std::bad_alloc();
  if (!reported.exchange(true)) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "[rank %d] [error] out of host memory (std::bad_alloc): this process could not allocate what it "
                  "needs; the plan logged above gives the memory per rank\n",
                  g_mpi->world_rank());
    std::fputs(line, stderr);
    std::fflush(stderr);
  }
  g_mpi->abort(2);
}

int report_error(const Status& status) {
  spdlog::error("{}", status.message());
  const int code = status.code() == StatusCode::kIoError ? 1 : 2;
  // One rank's failure ends every rank (with this rank's message logged), never a hang.
  if (g_mpi != nullptr && g_mpi->world_size() > 1) {
    spdlog::default_logger()->flush();
    std::fflush(stderr);
    g_mpi->abort(code);
  }
  return code;
}

}  // namespace gpt

int main(int argc, char** argv) {
  // Before any thread exists (MPI's, OpenMP's): the stop signals go to one waiting thread only.
  gpt::block_stop_signals();
  // MPI first: under mpirun or srun each process learns its rank; run alone it is a world of one.
  auto mpi = gpt::MpiEnvironment::init(&argc, &argv);
  if (!mpi) {
    std::fprintf(stderr, "error: %s\n", mpi.status().message().c_str());
    return 1;
  }
  gpt::g_mpi = mpi->get();
  std::set_new_handler(gpt::on_out_of_memory);
  gpt::g_world = (*mpi)->make_world();
  gpt::init_logging((*mpi)->world_rank());
  CLI::App app{"gpt-train: train GPT language models on a CPU, a GPU or a cluster (mpirun, srun)"};
  app.set_version_flag("--version", std::string("gpt-train ") + GPT_VERSION + " (" + GPT_BUILD_INFO + ")");
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  gpt-train prepare --input ../shared/data/tinyshakespeare.txt --out data/shakespeare_char\n"
      "  gpt-train train --config configs/shakespeare-char-cpu.yaml\n"
      "  gpt-train sample --run runs/shakespeare-char --prompt 'ROMEO:' --tokens 300\n"
      "  gpt-train plan --config configs/gpt2-124m.yaml --world-size 8 --device-memory-gb 80\n"
      "  gpt-train checkpoint inspect runs/shakespeare-char/checkpoints/step_00001000\n"
      "Run 'gpt-train SUBCOMMAND --help' for a subcommand's options.");
  std::map<CLI::App*, gpt::Command> commands;
  CLI::App* train = app.add_subcommand("train", "Train a model from a YAML run config");
  commands[train] = gpt::add_train_command(*train);
  CLI::App* prepare = app.add_subcommand("prepare", "Tokenize text files into train/val token shards");
  commands[prepare] = gpt::add_prepare_command(*prepare);
  CLI::App* sample = app.add_subcommand("sample", "Generate text from a trained model");
  commands[sample] = gpt::add_sample_command(*sample);
  CLI::App* plan = app.add_subcommand("plan", "Memory and communication per rank for every strategy; what auto picks");
  commands[plan] = gpt::add_plan_command(*plan);
  CLI::App* checkpoint =
      app.add_subcommand("checkpoint", "Inspect, verify or consolidate (to safetensors) a checkpoint or model");
  commands[checkpoint] = gpt::add_checkpoint_command(*checkpoint);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; a bad argument is bad input like any other: exit 2 (CLI11's own codes vary).
    const int code = app.exit(e) == 0 ? 0 : 2;
    gpt::g_world.reset();  // communicators go before the MPI environment (and its watchdog)
    return code;
  }
  int code = 0;
  for (auto& [sub, run] : commands) {
    if (!sub->parsed()) continue;
    // Under mpirun or srun with several tasks only `train` uses the ranks; any other subcommand runs on rank 0 alone
    // (every rank doing it would race on the same output files, or print its sample N times).
    if (sub != train && (*mpi)->world_size() > 1) {
      if ((*mpi)->world_rank() != 0) continue;
      spdlog::info("{} runs on rank 0 only; the job's other {} rank(s) have nothing to do", sub->get_name(),
                   (*mpi)->world_size() - 1);
    }
    try {
      code = run();
    } catch (const std::bad_alloc&) {
      // Host memory (a device's runs out through the backend's own error): the planner's figures were logged first.
      code = gpt::report_error(gpt::Status::failed_precondition(
          "out of host memory (std::bad_alloc) in `" + sub->get_name() +
          "`: this process could not allocate what it needs; for a run, the plan logged above gives the memory per "
          "rank (`gpt-train plan` shows it beforehand), and a smaller model, micro-batch or more ranks need less"));
    }
  }
  gpt::g_world.reset();
  return code;
}
