// The MPI environment of gpt_mpi_tests (initialised once in tests/comm/mpi_main.cc).
#pragma once

#include "comm/mpi_communicator.h"

namespace gpt::testing {
extern MpiEnvironment* g_mpi;
}  // namespace gpt::testing
