// gpt-train: the command-line entry point. Subcommands: train, prepare, sample, plan, checkpoint.
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string_view>

#include "apps/commands.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "core/logging.h"
#include "core/stop_signal.h"

namespace gpt {

namespace {
MpiEnvironment* g_mpi = nullptr;
std::unique_ptr<Communicator> g_world;
}  // namespace

Communicator& world() { return *g_world; }
int ranks_per_node() { return g_mpi != nullptr ? g_mpi->local_size() : 1; }
int local_rank() { return g_mpi != nullptr ? g_mpi->local_rank() : 0; }
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

// Whether a launcher (mpirun, srun, mpiexec) started this process as one of several: then MPI is initialised for
// every subcommand, so that ranks other than 0 learn that they have nothing to do. Run alone, only `train` initialises
// it (a world of one, the same code as several ranks); the other subcommands start without it, which spares them Open
// MPI's singleton start (about 0.3 s). Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE, PMIx launchers (srun --mpi=pmix,
// prterun) PMIX_RANK, PMI ones (srun --mpi=pmi2, MPICH's hydra) PMI_RANK or PMI_FD, and srun SLURM_STEP_NUM_TASKS.
bool launched_as_one_of_several() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  const char* tasks = std::getenv("SLURM_STEP_NUM_TASKS");
  return tasks != nullptr && std::string_view(tasks) != "1";
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
  gpt::init_logging(0);  // until the rank is known (the command line's errors come before)
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
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Under mpirun or srun each process learns its rank from MPI; run alone it is a world of one.
  std::unique_ptr<gpt::MpiEnvironment> mpi;
  if (train->parsed() || gpt::launched_as_one_of_several()) {
    auto env = gpt::MpiEnvironment::init(&argc, &argv);
    if (!env) {
      std::fprintf(stderr, "error: %s\n", env.status().message().c_str());
      return 1;
    }
    mpi = std::move(*env);
    gpt::g_mpi = mpi.get();
    gpt::g_world = mpi->make_world();
  } else {
    gpt::g_world = gpt::make_single_communicator();
  }
  std::set_new_handler(gpt::on_out_of_memory);
  const int world_rank = gpt::g_world->rank(), world_size = gpt::g_world->size();
  gpt::init_logging(world_rank);
  int code = 0;
  for (auto& [sub, run] : commands) {
    if (!sub->parsed()) continue;
    // Under mpirun or srun with several tasks only `train` uses the ranks; any other subcommand runs on rank 0 alone
    // (every rank doing it would race on the same output files, or print its sample N times).
    if (sub != train && world_size > 1) {
      if (world_rank != 0) continue;
      spdlog::info("{} runs on rank 0 only; the job's other {} rank(s) have nothing to do", sub->get_name(),
                   world_size - 1);
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
