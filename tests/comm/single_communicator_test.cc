#include <catch2/catch.hpp>
#include <vector>

#include "comm/communicator.h"

namespace gpt {
namespace {

TEST_CASE("The single-process communicator is a group of one that counts its collectives", "[comm]") {
  auto c = make_single_communicator();
  REQUIRE(c->size() == 1);
  std::vector<float> a = {1, 2, 3}, b(3);
  c->all_reduce(a.data(), 3, DType::kF32).wait();
  REQUIRE(a == std::vector<float>{1, 2, 3});
  c->reduce_scatter(a.data(), b.data(), 3, DType::kF32).wait();
  REQUIRE(b == a);
  c->all_gather(a.data(), b.data(), 3, DType::kF32).wait();
  REQUIRE(c->stats().last_seq == 3);
  REQUIRE(c->stats().ops[static_cast<size_t>(CommOp::kAllGather)].bytes == 12);
  REQUIRE(c->split(0, 0, "shard")->group_name() == "shard");
}

}  // namespace
}  // namespace gpt
