// One rank per GPU, by local rank; clear errors when the node has too few GPUs.
#include "comm/device_select.h"

#include <stdlib.h>

#include <catch2/catch.hpp>

namespace gpt {
namespace {

TEST_CASE("Each rank takes the GPU of its local rank, too many ranks per node is an error", "[comm]") {
  CHECK(device_for_local_rank(0, 4, 4).value() == 0);
  CHECK(device_for_local_rank(3, 4, 8).value() == 3);
  auto too_many = device_for_local_rank(2, 8, 4);
  REQUIRE(!too_many.has_value());
  CHECK(too_many.status().message().find("8 ranks run on this node but only 4 GPU(s) are visible") !=
        std::string::npos);
  CHECK(too_many.status().message().find("srun --ntasks-per-node=4") != std::string::npos);
  ::setenv("CUDA_VISIBLE_DEVICES", "3", 1);  // per-task binding: each rank sees its own GPU as device 0
  CHECK(device_for_local_rank(5, 8, 1).value() == 0);
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  CHECK(!device_for_local_rank(5, 8, 1).has_value());
  auto none = device_for_local_rank(0, 1, 0);
  REQUIRE(!none.has_value());
  CHECK(none.status().message().find("no CUDA device is visible") != std::string::npos);
}

}  // namespace
}  // namespace gpt
