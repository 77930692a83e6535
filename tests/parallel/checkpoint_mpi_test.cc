// Checkpoints under mpirun -np N: exact resume (bit for bit) under every strategy at the same world size, and
// resharding across strategies and world sizes (a chain of runs, each resuming the previous one's checkpoint
// on a different sub-communicator), with the optimizer state carried over.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "parallel/run_helpers.h"
#include "testing/mpi.h"

namespace gpt {
namespace {

namespace fs = std::filesystem;

// strategy "single" | "ddp" | "zero1" | "zero2" | "zero3" | "hybrid:S" (zero3 in shard groups of S).
void set_strategy(RunConfig& cfg, const std::string& strategy) {
  cfg.parallel.strategy = strategy.substr(0, strategy.find(':'));
  if (cfg.parallel.strategy == "hybrid") cfg.parallel.shard_group_size = std::stoi(strategy.substr(7));
}

TEST_CASE("Resuming from a checkpoint continues bit for bit under every strategy", "[mpi][checkpoint]") {
  auto world = testing::g_mpi->make_world();
  const int n = world->size(), r = world->rank();
  const std::string dir = shared_data_dir(*world);
  // "+async": checkpoint.async, the background writer on a communicator of its own. "+sr": bf16 parameters
  // rounded stochastically (the resumed run must round at the same step as the uninterrupted one).
  std::vector<std::string> strategies = {"ddp", "zero1", "zero2", "zero3", "zero3+async", "zero1+sr", "zero3+sr"};
  if (n % 2 == 0) strategies.push_back("hybrid:2");
  if (n == 1) strategies = {"single", "single+async", "single+sr"};
  for (const std::string& strategy : strategies) {
    CAPTURE(n, strategy);
    // Uninterrupted: 6 steps with dropout, checkpoints after steps 3 and 6.
    RunConfig cfg = make_config(dir, dir + "/exact_" + strategy, n, 0.1f, "none");
    set_strategy(cfg, strategy.substr(0, strategy.find('+')));
    cfg.checkpoint.async = strategy.ends_with("+async");
    if (strategy.ends_with("+sr")) {
      cfg.parallel.param_dtype = "bf16";
      cfg.parallel.stochastic_rounding = true;
    }
    cfg.training.steps = 6;
    cfg.training.decay_steps = 6;
    cfg.checkpoint.every = 3;
    const Result whole = train(cfg, *world);
    // Resumed from step 3 into another out_dir.
    RunConfig again = cfg;
    again.run.out_dir = dir + "/exact_resumed_" + strategy;
    again.checkpoint.resume = cfg.run.out_dir + "/checkpoints/" + step_dir_name(3);
    const Result resumed = train(again, *world);
    REQUIRE(resumed.losses.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
      CAPTURE(i);
      REQUIRE(resumed.losses[i] == whole.losses[3 + i]);  // bit for bit
    }
    REQUIRE(resumed.weights == whole.weights);
    // Auto-resume of a finished run trains nothing more and keeps the result.
    RunConfig done = cfg;
    done.checkpoint.resume = "auto";
    const Result nothing = train(done, *world);
    REQUIRE(nothing.losses.empty());
    REQUIRE(nothing.weights == whole.weights);
  }
  world->barrier().wait();
  if (r == 0) fs::remove_all(dir);
}

// A shard that fails to read on one rank (a flipped byte: its checksum) fails the resume on every rank, together:
// that rank with the file named, the others naming that rank. Before, the others went on into the all-gathers that
// publish the parameters and waited there for it (on GPUs, NCCL's teardown would wait for it too).
TEST_CASE("A shard that fails to read on one rank fails the resume on every rank, naming that rank",
          "[mpi][checkpoint]") {
  auto world = testing::g_mpi->make_world();
  const int n = world->size(), r = world->rank();
  const std::string dir = shared_data_dir(*world);
  RunConfig cfg = make_config(dir, dir + "/bad_shard", n, 0.0f, "none");
  set_strategy(cfg, n == 1 ? "single" : "zero3");  // zero3 at the same world size: rank r reads shard r alone
  cfg.training.steps = 2;
  cfg.checkpoint.every = 2;
  (void)train(cfg, *world);
  const std::string ck = cfg.run.out_dir + "/checkpoints/" + step_dir_name(2);
  const int bad = n - 1;
  char shard[32];
  std::snprintf(shard, sizeof shard, "shard_%05d.bin", bad);
  if (r == bad) {
    std::fstream f(ck + "/" + shard, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekp(100);
    f.put('\x7f');
  }
  world->barrier().wait();
  RunConfig again = cfg;
  again.run.out_dir = dir + "/bad_shard_resumed";
  again.checkpoint.resume = ck;
  auto trainer = Trainer::create(again, *world, 1, 0);
  REQUIRE_FALSE(trainer.has_value());
  const std::string msg = trainer.status().message();
  INFO(msg);
  CHECK(trainer.status().code() == StatusCode::kCorruption);  // every rank's: the job's exit code is the same
  if (r == bad) {
    CHECK(msg.find(std::string(shard) + ": checksum mismatch") != std::string::npos);
  } else {
    CHECK(msg.find("resuming from " + ck + " failed on rank " + std::to_string(bad)) != std::string::npos);
  }
  world->barrier().wait();
}

// A run's first save retires its checkpoint root's later steps (the abandoned future of a resumed run), so a run that
// does not continue that root's own steps must not start there: a fresh run, or one resuming a checkpoint kept
// elsewhere, into a root that holds another run's steps is refused on every rank, and the steps stay. A checkpoint
// root given as checkpoint.resume continues its latest step.
TEST_CASE("A run that would replace another run's checkpoints is refused; a checkpoint root resumes its latest",
          "[mpi][checkpoint]") {
  auto world = testing::g_mpi->make_world();
  const int n = world->size();
  const std::string dir = shared_data_dir(*world);
  RunConfig cfg = make_config(dir, dir + "/taken", n, 0.0f, "none");
  set_strategy(cfg, n == 1 ? "single" : "zero2");
  cfg.training.steps = 2;
  cfg.checkpoint.every = 2;
  (void)train(cfg, *world);
  const std::string root = cfg.run.out_dir + "/checkpoints", step2 = root + "/" + step_dir_name(2);
  RunConfig other = make_config(dir, dir + "/elsewhere", n, 0.0f, "none");
  other.training.steps = 2;
  other.checkpoint.every = 2;
  (void)train(other, *world);
  const std::string their_step = other.run.out_dir + "/checkpoints/" + step_dir_name(2);

  RunConfig fresh = cfg;  // resume empty
  RunConfig foreign = cfg;
  foreign.checkpoint.resume = their_step;
  for (const RunConfig* run : {&fresh, &foreign}) {
    auto trainer = Trainer::create(*run, *world, 1, 0);
    REQUIRE_FALSE(trainer.has_value());
    INFO(trainer.status().message());
    CHECK(trainer.status().code() == StatusCode::kFailedPrecondition);
    if (world->rank() == 0) {
      CHECK(trainer.status().message().find(root + " already holds the checkpoints of an earlier run (latest " +
                                            step_dir_name(2) + ")") != std::string::npos);
      CHECK(trainer.status().message().find("--resume auto") != std::string::npos);
    }
    world->barrier().wait();
    REQUIRE(fs::exists(step2 + "/manifest.json"));
  }

  // Its own root, as checkpoint.resume: step 2 resumed (with a trailing slash on a step directory alike).
  for (const std::string& resume : {root, step2 + "/"}) {
    CAPTURE(resume);
    RunConfig more = cfg;
    more.training.steps = 3;
    more.checkpoint.resume = resume;
    const Result r = train(more, *world);
    CHECK(r.losses.size() == 1);
  }
  world->barrier().wait();
}

// A chain of runs on sub-communicators of the world, each resuming the previous run's checkpoint saved two
// steps before that run ended: the first loss after loading equals the saving run's within 1e-6 (weights
// resharded), the second within 1e-5 (AdamW's moments resharded too).
TEST_CASE("A checkpoint saved under any strategy and world size loads under any other", "[mpi][checkpoint]") {
  auto world = testing::g_mpi->make_world();
  const int n = world->size(), r = world->rank();
  struct Stage {
    std::string strategy;
    int ranks;
  };
  std::vector<Stage> chain;
  if (n == 4) chain = {{"zero3", 4}, {"ddp", 2}, {"single", 1}, {"hybrid:2", 4}, {"zero3", 3}};
  if (n == 3) chain = {{"zero3", 3}, {"zero2", 2}, {"zero1", 3}, {"single", 1}};
  if (n == 2) chain = {{"zero3", 2}, {"single", 1}, {"ddp", 2}, {"zero1", 2}};
  if (chain.empty()) return;  // one rank: the single-strategy case is in the test above
  const std::string dir = shared_data_dir(*world);
  std::vector<float> prev_losses;  // the previous stage's losses by step (rank 0's view)
  std::string prev_ckpt;
  int64_t step = 0;
  for (size_t k = 0; k < chain.size(); ++k) {
    const Stage& st = chain[k];
    CAPTURE(n, k, st.strategy, st.ranks);
    auto comm = world->split(r < st.ranks ? 0 : 1, r, "stage");
    const int64_t save_at = step + 2, end = step + 4;
    std::vector<float> losses(static_cast<size_t>(end), 0.0f);
    if (r < st.ranks) {
      RunConfig cfg = make_config(dir, dir + "/chain_" + std::to_string(k), st.ranks, 0.0f, "none");
      set_strategy(cfg, st.strategy);
      cfg.training.steps = end;
      cfg.training.decay_steps = 20;
      cfg.checkpoint.every = 2;
      cfg.checkpoint.resume = prev_ckpt;
      std::unique_ptr<Communicator> alone;
      Communicator* c = comm.get();
      if (st.strategy == "single") {
        alone = make_single_communicator();
        c = alone.get();
      }
      const Result res = train(cfg, *c);
      REQUIRE(static_cast<int64_t>(res.losses.size()) == end - step);
      for (size_t i = 0; i < res.losses.size(); ++i) losses[static_cast<size_t>(step) + i] = res.losses[i];
      if (k > 0 && r == 0) {
        for (int64_t s : {step, step + 1}) {
          const float want = prev_losses[static_cast<size_t>(s)], got = losses[static_cast<size_t>(s)];
          CAPTURE(s + 1, want, got);
          CHECK(std::abs(got - want) <= (s == step ? 1e-6 : 1e-5) * std::abs(want));
        }
      }
    }
    world->barrier().wait();
    world->broadcast(losses.data(), end, DType::kF32, 0).wait();
    prev_losses = losses;
    prev_ckpt = dir + "/chain_" + std::to_string(k) + "/checkpoints/" + step_dir_name(save_at);
    step = save_at;
  }
  world->barrier().wait();
  if (r == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace gpt
