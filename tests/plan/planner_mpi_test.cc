// Measured against planned under mpirun -np N (N = 2..4, where units are padded to a multiple of the shard
// group): each rank's peak bytes per category and the collectives' elements and bytes per step equal the
// plan for world size N, in fp32 and bf16, and for hybrid shard groups of 2 when N = 4.
#include <catch2/catch.hpp>

#include "plan/measure.h"
#include "plan/planner.h"
#include "testing/mpi.h"

namespace gpt {
namespace {

TEST_CASE("planned bytes and communication equal what each rank allocates and counts", "[plan][mpi]") {
  auto world = testing::g_mpi->make_world();
  const int N = world->size();
  const auto mode = GENERATE(as<std::string>{}, "none", "every:2");
  const auto dtype = GENERATE(DType::kF32, DType::kBF16);
  PlanInput in;
  in.shape = {3, 2, 62, 16, 101, 0.0f};  // unit sizes that no N in 2..4 divides
  in.micro_batch = 2;
  in.micro_batches_per_step = 2;
  in.world_size = N;
  in.ranks_per_node = N == 4 ? 2 : N;  // hybrid shard groups of 2 at N = 4
  in.activation_checkpointing = mode;
  in.sharding.param_dtype = dtype;
  in.sharding.reduce_dtype = dtype;
  for (const StrategyPlan& p : plan_all(in)) {
    INFO("rank " << world->rank() << " of " << N << ", strategy " << p.name() << ", activation checkpointing " << mode
                 << ", " << dtype_name(dtype));
    std::unique_ptr<Communicator> shard, replicate;
    Communicator* group = world.get();
    if (p.hybrid()) {  // the trainer's mesh: world rank w is shard w % S of replica w / S
      const int w = world->rank(), S = p.shard_group_size;
      shard = world->split(w / S, w % S, "shard");
      replicate = world->split(w % S, w / S, "replicate");
      group = shard.get();
    }
    const testing::Measured m = testing::run_and_measure(in, p.strategy, *group, replicate.get());
    // The plan leaves out scalar all-reduces: the sharded strategies' grad norm is one element.
    const bool norm = p.strategy != Strategy::kSingle && p.strategy != Strategy::kDdp && group->size() > 1;
    testing::check_matches_plan(m, p, norm ? 1 : 0);
    CHECK(m.bytes_of(CommOp::kAllReduce) == p.comm_bytes_per_step.all_reduce + (norm ? 4 : 0));
    CHECK(m.bytes_of(CommOp::kReduceScatter) == p.comm_bytes_per_step.reduce_scatter);
    CHECK(m.bytes_of(CommOp::kAllGather) == p.comm_bytes_per_step.all_gather);
  }
}

}  // namespace
}  // namespace gpt
