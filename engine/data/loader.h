// DataLoader: deterministic, resumable (inputs, targets) batches from token shards.
// Row r of global batch k is a window of T+1 consecutive tokens of one shard (a window never crosses a
// shard boundary); inputs are its first T tokens, targets its last T.
//   random:     the window start is drawn by CounterRng(seed, stream of the split) at index (k, r),
//               uniformly over all valid starts of all shards (nanoGPT's get_batch).
//   sequential: windows are laid back to back with stride T through the shards in name order, row-major
//               over (k, r): window number k*G + r, modulo the windows in one pass (an epoch).
// So a row depends only on (seed, k, r) (and, for sequential, G), never on how many ranks share the batch:
// each data-parallel rank fills its own rows of the same global batch with fill_rows.
// Thread rules: fill_rows is const and thread-safe; the cursor (next_batch_index, restore) is not.
// The loader owns the shard mappings; it is move-only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "data/token_shard.h"

namespace gpt::data {

enum class SamplingMode { kRandom, kSequential };
// "random" | "sequential".
Expected<SamplingMode> parse_sampling_mode(std::string_view name);

// The files a shard path or glob pattern names, sorted byte-wise (not by locale) so every machine reads them in the
// same order. A literal path with glob characters ("[1]") names its file; no match is kNotFound.
Expected<std::vector<std::string>> expand_pattern(const std::string& pattern);

struct LoaderOptions {
  // A shard path or a glob pattern ("data/fineweb_train_*.bin"); matches are read in name order.
  std::string pattern;
  // T: tokens per row of inputs (and of targets). >= 1.
  int64_t block_size = 0;
  // G: rows (sequences) per global batch, i.e. per optimizer step over all ranks. >= 1.
  int64_t global_batch = 0;
  uint64_t seed = 0;
  SamplingMode mode = SamplingMode::kRandom;
  // Names the random stream, so train and val draw independent windows from the same seed.
  std::string split = "train";
};

// What a checkpoint stores to resume the loader: the next global batch to hand out.
struct LoaderState {
  uint64_t batch_index = 0;
  // G when the state was taken; sequential order continues correctly only with the same G.
  int64_t global_batch = 0;
};

class DataLoader {
 public:
  // Errors: no file matches the pattern (naming it), a shard that cannot be read (see TokenShard::open),
  // a shard shorter than T+1 tokens, block_size or global_batch out of range.
  static Expected<DataLoader> open(const LoaderOptions& options);

  // Writes rows [row_begin, row_begin + row_count) of global batch `batch_index` into inputs and targets,
  // each (row_count, T) row-major. REQUIRES: 0 <= row_begin, row_begin + row_count <= G; buffers hold
  // row_count * T int32 each.
  void fill_rows(uint64_t batch_index, int64_t row_begin, int64_t row_count, int32_t* inputs, int32_t* targets) const;

  // The cursor: returns the batch index to use now and advances to the next one.
  uint64_t next_batch_index() { return batch_index_++; }
  LoaderState state() const { return {batch_index_, options_.global_batch}; }
  // Continues from a saved state. Error when sequential and the state was taken with a different G.
  [[nodiscard]] Status restore(const LoaderState& state);

  // The largest token id over all shards (reads every shard once), so the trainer can check vocab_size.
  int32_t max_token() const;
  int64_t num_tokens() const { return num_tokens_; }
  const std::vector<TokenShard>& shards() const { return shards_; }
  int64_t block_size() const { return options_.block_size; }
  int64_t global_batch() const { return options_.global_batch; }
  // Distinct windows in one sequential pass over the data.
  uint64_t windows_per_epoch() const { return window_offsets_.back(); }

 private:
  DataLoader() = default;
  // The (shard, token offset) where row r of batch k starts.
  std::pair<size_t, int64_t> window_start(uint64_t batch_index, int64_t row) const;

  LoaderOptions options_;
  std::vector<TokenShard> shards_;
  // Prefix sums over shards, (num_shards + 1,): valid random starts (n - T each) and sequential
  // windows ((n - 1) / T each).
  std::vector<uint64_t> start_offsets_, window_offsets_;
  uint64_t stream_ = 0;
  int64_t num_tokens_ = 0;
  uint64_t batch_index_ = 0;
};

}  // namespace gpt::data
