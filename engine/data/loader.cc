#include "data/loader.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "core/rng.h"

namespace gpt::data {

Expected<std::vector<std::string>> expand_pattern(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  if (rc != 0 && rc != GLOB_NOMATCH) return Status::io_error("data pattern '" + pattern + "': glob failed");
  if (paths.empty()) {
    // A literal path that happens to contain glob characters ("[1]") still names its file.
    std::error_code ec;
    if (!std::filesystem::exists(pattern, ec)) return Status::not_found("no files match '" + pattern + "'");
    paths.push_back(pattern);
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

Expected<SamplingMode> parse_sampling_mode(std::string_view name) {
  if (name == "random") return SamplingMode::kRandom;
  if (name == "sequential") return SamplingMode::kSequential;
  return Status::invalid_argument("unknown sampling mode \"" + std::string(name) + "\", expected random or sequential");
}

Expected<DataLoader> DataLoader::open(const LoaderOptions& options) {
  if (options.block_size < 1) {
    return Status::invalid_argument("block_size must be >= 1, got " + std::to_string(options.block_size));
  }
  // Rows are addressed with 32 bits in the random stream index.
  if (options.global_batch < 1 || options.global_batch > INT32_MAX) {
    return Status::invalid_argument("global batch must be in [1, 2^31), got " + std::to_string(options.global_batch));
  }
  GPT_ASSIGN_OR_RETURN(std::vector<std::string> paths, expand_pattern(options.pattern));

  DataLoader loader;
  loader.options_ = options;
  loader.stream_ = hash_name("data/" + options.split);
  loader.start_offsets_.push_back(0);
  loader.window_offsets_.push_back(0);
  const int64_t t = options.block_size;
  for (const std::string& path : paths) {
    GPT_ASSIGN_OR_RETURN(TokenShard shard, TokenShard::open(path));
    if (shard.size() < t + 1) {
      return Status::invalid_argument("block_size T=" + std::to_string(t) +
                                      " needs at least T+1 = " + std::to_string(t + 1) + " tokens; shard " + path +
                                      " has " + std::to_string(shard.size()));
    }
    loader.start_offsets_.push_back(loader.start_offsets_.back() + static_cast<uint64_t>(shard.size() - t));
    loader.window_offsets_.push_back(loader.window_offsets_.back() + static_cast<uint64_t>((shard.size() - 1) / t));
    loader.num_tokens_ += shard.size();
    loader.shards_.push_back(std::move(shard));
  }
  return loader;
}

std::pair<size_t, int64_t> DataLoader::window_start(uint64_t batch_index, int64_t row) const {
  const bool random = options_.mode == SamplingMode::kRandom;
  const std::vector<uint64_t>& offsets = random ? start_offsets_ : window_offsets_;
  const uint64_t total = offsets.back();
  uint64_t global;
  if (random) {
    // Index (k, r) -> (k << 32 | r): r < 2^31 is checked at open; k is assumed < 2^32. The multiply-high maps 64 random
    // bits onto [0, total) with a bias below total / 2^64.
    const uint64_t bits = CounterRng(options_.seed, stream_).u64(batch_index << 32 | static_cast<uint64_t>(row));
    global = static_cast<uint64_t>((static_cast<unsigned __int128>(bits) * total) >> 64);
  } else {
    const auto window = static_cast<unsigned __int128>(batch_index) * static_cast<uint64_t>(options_.global_batch) +
                        static_cast<uint64_t>(row);
    global = static_cast<uint64_t>(window % total);
  }
  // The shard whose range [offsets[s], offsets[s+1]) holds `global`.
  const size_t s = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), global) - offsets.begin()) - 1;
  const uint64_t local = global - offsets[s];
  return {s, static_cast<int64_t>(random ? local : local * static_cast<uint64_t>(options_.block_size))};
}

void DataLoader::fill_rows(uint64_t batch_index, int64_t row_begin, int64_t row_count, int32_t* inputs,
                           int32_t* targets) const {
  GPT_CHECK(row_begin >= 0 && row_count >= 0 && row_begin + row_count <= options_.global_batch);
  const int64_t t = options_.block_size;
  for (int64_t i = 0; i < row_count; ++i) {
    const auto [s, start] = window_start(batch_index, row_begin + i);
    const uint16_t* window = shards_[s].tokens().data() + start;  // (T+1,)
    int32_t* in = inputs + i * t;
    int32_t* tg = targets + i * t;
    for (int64_t j = 0; j < t; ++j) {
      in[j] = window[j];
      tg[j] = window[j + 1];
    }
  }
}

Status DataLoader::restore(const LoaderState& state) {
  if (options_.mode == SamplingMode::kSequential && state.global_batch != options_.global_batch) {
    return Status::failed_precondition(
        "data loader state was saved with global batch " + std::to_string(state.global_batch) + ", now " +
        std::to_string(options_.global_batch) + "; sequential order cannot continue across a batch size change");
  }
  batch_index_ = state.batch_index;
  return Status::ok();
}

int32_t DataLoader::max_token() const {
  int32_t m = -1;
  for (const TokenShard& shard : shards_) m = std::max(m, shard.max_token());
  return m;
}

}  // namespace gpt::data
