#include "data/loader.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <set>
#include <vector>

#include "testing/temp_dir.h"

namespace gpt::data {
namespace {

using gpt::testing::TempDir;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A shard whose tokens are first, first+1, ..., so a window shows where it came from.
std::string write_ramp(const TempDir& dir, const std::string& name, uint16_t first, int n) {
  std::vector<uint16_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), first);
  REQUIRE(write_token_shard(dir.file(name), tokens).is_ok());
  return dir.file(name);
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch fetch(const DataLoader& loader, uint64_t k, int64_t row_begin, int64_t rows) {
  Batch b{std::vector<int32_t>(static_cast<size_t>(rows * loader.block_size())),
          std::vector<int32_t>(static_cast<size_t>(rows * loader.block_size()))};
  loader.fill_rows(k, row_begin, rows, b.inputs.data(), b.targets.data());
  return b;
}

LoaderOptions options_for(const TempDir& dir, SamplingMode mode) {
  LoaderOptions o;
  o.pattern = dir.file("shard_*.bin");
  o.block_size = 8;
  o.global_batch = 6;
  o.seed = 1234;
  o.mode = mode;
  return o;
}

TEST_CASE("loader random mode: deterministic, rank-split independent, resumable", "[data]") {
  TempDir dir;
  write_ramp(dir, "shard_b.bin", 1000, 50);  // sorted by name: shard_a comes first
  write_ramp(dir, "shard_a.bin", 0, 100);
  Expected<DataLoader> loader = DataLoader::open(options_for(dir, SamplingMode::kRandom));
  REQUIRE(loader.has_value());
  REQUIRE(loader->shards().size() == 2);
  CHECK(loader->shards()[0].path() == dir.file("shard_a.bin"));
  CHECK(loader->num_tokens() == 150);
  CHECK(loader->max_token() == 1049);

  Expected<DataLoader> again = DataLoader::open(options_for(dir, SamplingMode::kRandom));
  REQUIRE(again.has_value());
  std::set<int32_t> first_tokens;
  for (uint64_t k = 0; k < 50; ++k) {
    const Batch whole = fetch(*loader, k, 0, 6);
    CHECK(whole == fetch(*again, k, 0, 6));
    Batch halves = fetch(*loader, k, 0, 3);
    const Batch second = fetch(*loader, k, 3, 3);
    halves.inputs.insert(halves.inputs.end(), second.inputs.begin(), second.inputs.end());
    halves.targets.insert(halves.targets.end(), second.targets.begin(), second.targets.end());
    CHECK(whole == halves);
    for (size_t r = 0; r < 6; ++r) {
      const int32_t* in = &whole.inputs[r * 8];
      const int32_t* tg = &whole.targets[r * 8];
      first_tokens.insert(in[0]);
      for (int j = 0; j < 8; ++j) {
        CHECK(tg[j] == in[j] + 1);  // consecutive tokens of one shard: never across a boundary
        CHECK(((in[0] >= 0 && tg[7] < 100) || (in[0] >= 1000 && tg[7] < 1050)));
      }
    }
  }
  CHECK(first_tokens.size() > 100);  // 300 draws over 92 + 42 starts reach most of them
  CHECK(*first_tokens.begin() < 1000);
  CHECK(*first_tokens.rbegin() >= 1000);

  LoaderOptions other_seed = options_for(dir, SamplingMode::kRandom);
  other_seed.seed = 99;
  CHECK_FALSE(fetch(*DataLoader::open(other_seed), 0, 0, 6) == fetch(*loader, 0, 0, 6));
  LoaderOptions val = options_for(dir, SamplingMode::kRandom);
  val.split = "val";
  CHECK_FALSE(fetch(*DataLoader::open(val), 0, 0, 6) == fetch(*loader, 0, 0, 6));

  // The cursor: run three steps, save, run two more; a restored loader repeats those two.
  for (int i = 0; i < 3; ++i) loader->next_batch_index();
  const LoaderState saved = loader->state();
  CHECK(saved.batch_index == 3);
  std::vector<Batch> expected;
  for (int i = 0; i < 2; ++i) expected.push_back(fetch(*loader, loader->next_batch_index(), 0, 6));
  REQUIRE(again->restore(saved).is_ok());
  for (int i = 0; i < 2; ++i) CHECK(fetch(*again, again->next_batch_index(), 0, 6) == expected[i]);
}

TEST_CASE("loader sequential mode covers the data in order, then wraps", "[data]") {
  TempDir dir;
  write_ramp(dir, "shard_0.bin", 0, 33);     // (33-1)/8 = 4 windows: starts 0, 8, 16, 24
  write_ramp(dir, "shard_1.bin", 1000, 20);  // (20-1)/8 = 2 windows: starts 1000, 1008
  LoaderOptions o = options_for(dir, SamplingMode::kSequential);
  o.global_batch = 4;
  Expected<DataLoader> loader = DataLoader::open(o);
  REQUIRE(loader.has_value());
  REQUIRE(loader->windows_per_epoch() == 6);
  const int32_t starts[] = {0, 8, 16, 24, 1000, 1008};
  for (uint64_t k = 0; k < 6; ++k) {  // 24 rows = 4 epochs
    const Batch b = fetch(*loader, k, 0, 4);
    for (int r = 0; r < 4; ++r) {
      const int32_t start = starts[(k * 4 + static_cast<uint64_t>(r)) % 6];
      for (int j = 0; j < 8; ++j) {
        CHECK(b.inputs[static_cast<size_t>(r * 8 + j)] == start + j);
        CHECK(b.targets[static_cast<size_t>(r * 8 + j)] == start + j + 1);
      }
    }
  }
  LoaderState state = loader->state();
  state.global_batch = 8;
  CHECK(contains(loader->restore(state).message(), "global batch 8"));
}

TEST_CASE("loader errors", "[data]") {
  TempDir dir;
  LoaderOptions o = options_for(dir, SamplingMode::kRandom);
  Status none = DataLoader::open(o).status();
  CHECK(none.code() == StatusCode::kNotFound);
  CHECK(contains(none.message(), o.pattern));

  write_ramp(dir, "shard_0.bin", 0, 100);
  const std::string short_shard = write_ramp(dir, "shard_1.bin", 0, 8);
  Status too_short = DataLoader::open(o).status();
  CHECK(contains(too_short.message(), "block_size T=8 needs at least T+1 = 9 tokens; shard " + short_shard + " has 8"));

  o.pattern = dir.file("shard_0.bin");  // a plain path works too
  REQUIRE(DataLoader::open(o).has_value());
  o.block_size = 0;
  CHECK_FALSE(DataLoader::open(o).has_value());
  o.block_size = 8;
  o.global_batch = 0;
  CHECK_FALSE(DataLoader::open(o).has_value());
  CHECK(parse_sampling_mode("sequential").value() == SamplingMode::kSequential);
  CHECK_FALSE(parse_sampling_mode("shuffle").has_value());
}

}  // namespace
}  // namespace gpt::data
