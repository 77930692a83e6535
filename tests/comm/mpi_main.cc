// Main of gpt_mpi_tests: the tests that run under `mpirun -np N` (see tests/comm/CMakeLists.txt).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "comm/mpi_communicator.h"
#include "core/logging.h"
#include "testing/mpi.h"

namespace gpt::testing {
MpiEnvironment* g_mpi = nullptr;
}

int main(int argc, char** argv) {
  auto env = gpt::MpiEnvironment::init(&argc, &argv);
  if (!env) return 3;
  gpt::testing::g_mpi = env->get();
  gpt::init_logging((*env)->world_rank(), "warn");
  const int failed = Catch::Session().run(argc, argv);
  return failed == 0 ? 0 : 1;
}
