// The MPI communicator under mpirun -np N: every collective's result on every rank, bf16 as 2-byte
// elements, in-place forms, sub-groups from split, in-order async execution and the counters.
#include <catch2/catch.hpp>
#include <numeric>
#include <vector>

#include "core/dtype.h"
#include "testing/mpi.h"

namespace gpt {
namespace {

using testing::g_mpi;

TEST_CASE("all_reduce sums f32 and bf16 across ranks, in place", "[mpi]") {
  auto world = g_mpi->make_world();
  const int n = world->size(), r = world->rank();
  std::vector<float> x(1000);
  for (int i = 0; i < 1000; ++i) x[i] = static_cast<float>(i + r);
  world->all_reduce(x.data(), 1000, DType::kF32).wait();
  for (int i = 0; i < 1000; ++i) REQUIRE(x[i] == static_cast<float>(n * i + n * (n - 1) / 2));

  std::vector<bf16> y(64);
  for (int i = 0; i < 64; ++i) y[i] = f32_to_bf16(static_cast<float>(i % 8 + r));
  world->all_reduce(y.data(), 64, DType::kBF16).wait();
  for (int i = 0; i < 64; ++i) REQUIRE(bf16_to_f32(y[i]) == static_cast<float>(n * (i % 8) + n * (n - 1) / 2));
}

TEST_CASE("reduce_scatter gives each rank the sum of its block, all_gather concatenates", "[mpi]") {
  auto world = g_mpi->make_world();
  const int n = world->size(), r = world->rank();
  const int block = 37;  // deliberately odd
  std::vector<float> send(static_cast<size_t>(n) * block), recv(block);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<float>(i) + 1000.0f * r;
  world->reduce_scatter(send.data(), recv.data(), block, DType::kF32).wait();
  for (int i = 0; i < block; ++i) {
    REQUIRE(recv[i] == static_cast<float>(n * (r * block + i)) + 1000.0f * n * (n - 1) / 2);
  }
  // all_gather, out of place and in place (the send buffer is this rank's block of recv).
  std::vector<float> gathered(static_cast<size_t>(n) * block, -1.0f);
  std::vector<float> mine(block, static_cast<float>(r));
  world->all_gather(mine.data(), gathered.data(), block, DType::kF32).wait();
  for (size_t i = 0; i < gathered.size(); ++i) REQUIRE(gathered[i] == static_cast<float>(i / block));
  std::vector<float> inplace(static_cast<size_t>(n) * block, -1.0f);
  std::fill(inplace.begin() + r * block, inplace.begin() + (r + 1) * block, static_cast<float>(r * 2));
  world->all_gather(inplace.data() + r * block, inplace.data(), block, DType::kF32).wait();
  for (size_t i = 0; i < inplace.size(); ++i) REQUIRE(inplace[i] == static_cast<float>(2 * (i / block)));
}

TEST_CASE("broadcast, barrier, and collectives complete in issue order", "[mpi]") {
  auto world = g_mpi->make_world();
  const int r = world->rank();
  std::vector<float> b(10, static_cast<float>(r));
  Work w1 = world->broadcast(b.data(), 10, DType::kF32, world->size() - 1);
  std::vector<float> s(10, 1.0f);
  Work w2 = world->all_reduce(s.data(), 10, DType::kF32);
  Work w3 = world->barrier();
  w3.wait();  // the last one done implies the earlier ones are done: one in-order stream
  REQUIRE(w1.is_done());
  REQUIRE(w2.is_done());
  for (float v : b) REQUIRE(v == static_cast<float>(world->size() - 1));
  for (float v : s) REQUIRE(v == static_cast<float>(world->size()));
}

TEST_CASE("split makes sub-groups whose collectives stay inside them", "[mpi]") {
  auto world = g_mpi->make_world();
  const int n = world->size(), r = world->rank();
  const int groups = n % 2 == 0 ? 2 : 1;  // shard groups of n/2 when possible
  const int group_size = n / groups;
  auto shard = world->split(r / group_size, r % group_size, "shard");
  REQUIRE(shard->size() == group_size);
  REQUIRE(shard->rank() == r % group_size);
  REQUIRE(shard->group_name() == "shard");
  float v = static_cast<float>(r);
  shard->all_reduce(&v, 1, DType::kF32).wait();
  const int first = (r / group_size) * group_size;
  float want = 0;
  for (int k = first; k < first + group_size; ++k) want += static_cast<float>(k);
  REQUIRE(v == want);
}

TEST_CASE("counters record calls, elements and bytes per op", "[mpi]") {
  auto world = g_mpi->make_world();
  const int n = world->size();
  std::vector<float> x(100 * n), y(100);
  world->all_reduce(x.data(), 100, DType::kF32);
  world->reduce_scatter(x.data(), y.data(), 100, DType::kF32);
  std::vector<bf16> h(50 * n);
  world->all_gather(h.data() + 50 * world->rank(), h.data(), 50, DType::kBF16).wait();
  const CommStats s = world->stats();
  REQUIRE(s.last_seq == 3);
  REQUIRE(s.ops[static_cast<size_t>(CommOp::kAllReduce)].calls == 1);
  REQUIRE(s.ops[static_cast<size_t>(CommOp::kAllReduce)].elements == 100);
  REQUIRE(s.ops[static_cast<size_t>(CommOp::kReduceScatter)].elements == 100 * n);
  REQUIRE(s.ops[static_cast<size_t>(CommOp::kAllGather)].bytes == 2 * 50 * n);
}

TEST_CASE("MPI environment knows the world and the node", "[mpi]") {
  REQUIRE(g_mpi->world_size() >= 1);
  REQUIRE(g_mpi->local_size() == g_mpi->world_size());  // one node here
  REQUIRE(g_mpi->local_rank() == g_mpi->world_rank());
}

}  // namespace
}  // namespace gpt
