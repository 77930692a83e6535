// Main of gpt_nccl_emu_tests: tests/comm/nccl_communicator_test.cc (the [nccl] tests written for GPUs) over the
// NCCL shim, under `mpirun -np N` with EMU_DEVICES >= N (one emulated GPU per rank). Afterwards every NCCL
// communicator the tests made must have been destroyed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "comm/mpi_communicator.h"
#include "core/logging.h"
#include "nccl.h"
#include "testing/mpi.h"

namespace gpt::testing {
MpiEnvironment* g_mpi = nullptr;
}

int main(int argc, char** argv) {
  auto env = gpt::MpiEnvironment::init(&argc, &argv);
  if (!env) return 3;
  gpt::testing::g_mpi = env->get();
  gpt::init_logging((*env)->world_rank(), "warn");
  int failed = 0;
  {
    const auto world = (*env)->make_world();  // what the emulated NCCL communicators are split from
    nccl_emu_set_world(world.get());
    failed = Catch::Session().run(argc, argv);
    if (const int live = nccl_emu_live_comms(); live != 0) {
      std::fprintf(stderr, "rank %d: %d NCCL communicator(s) never destroyed\n", (*env)->world_rank(), live);
      failed = 1;
    }
    world->barrier().wait();
    nccl_emu_set_world(nullptr);
  }
  return failed == 0 ? 0 : 1;
}
