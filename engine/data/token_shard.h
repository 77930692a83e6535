// Token shard files, byte-compatible with karpathy/llm.c's data files:
//   header: 256 little-endian int32; [0] = magic 20240520, [1] = version 1, [2] = token count N,
//           the rest zero;
//   body:   N little-endian uint16 tokens, so the file is exactly 1024 + 2*N bytes.
// write_token_shard writes path + ".tmp", fsyncs and renames, so a shard is never seen half-written.
// TokenShard::open maps the file read-only and validates the header against the file size; every error
// names the file. A TokenShard owns its mapping (move-only); tokens() is valid while it lives. Reads are
// thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace gpt::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);  // 1024

[[nodiscard]] Status write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

class TokenShard {
 public:
  static Expected<TokenShard> open(const std::string& path);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();

  const std::string& path() const { return path_; }
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(size_)}; }
  int64_t size() const { return size_; }
  // The largest token id in the shard; -1 for an empty shard. Computed on the first call (a full read of
  // the shard, so opening a large data set stays cheap) and cached; safe to call from several threads.
  int32_t max_token() const;

 private:
  TokenShard() = default;
  void unmap();

  std::string path_;
  void* map_ = nullptr;  // the whole file, read-only; nullptr when moved from
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;  // (size_,) inside map_
  int64_t size_ = 0;
  static constexpr int32_t kNotComputed = -2;
  mutable std::atomic<int32_t> max_token_{kNotComputed};
};

}  // namespace gpt::data
