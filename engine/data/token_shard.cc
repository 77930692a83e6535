#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/atomic_file.h"

namespace gpt::data {

// The format is little-endian and we read it in place through the mapping.
static_assert(std::endian::native == std::endian::little, "token shards are read in place: little-endian only");

Status write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::invalid_argument(path + ": " + std::to_string(tokens.size()) +
                                    " tokens do not fit one shard (the header count is an int32)");
  }
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  return write_file_atomically(
      path, {std::span<const char>(reinterpret_cast<const char*>(header.data()), kShardHeaderBytes),
             std::span<const char>(reinterpret_cast<const char*>(tokens.data()), tokens.size_bytes())});
}

Expected<TokenShard> TokenShard::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string msg = "token shard " + path + ": cannot open: " + std::strerror(err);
    return err == ENOENT ? Status::not_found(msg) : Status::io_error(msg);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::io_error("token shard " + path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {  // a directory or a device given as data: bad input, not an I/O failure
    ::close(fd);
    return Status::invalid_argument("token shard " + path + ": not a regular file");
  }
  const size_t file_bytes = static_cast<size_t>(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    return Status::corruption("token shard " + path + ": file is " + std::to_string(file_bytes) +
                              " bytes, shorter than the " + std::to_string(kShardHeaderBytes) + "-byte header");
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return Status::io_error("token shard " + path + ": mmap failed: " + std::strerror(map_err));
  }

  TokenShard shard;
  shard.path_ = path;
  shard.map_ = map;
  shard.map_bytes_ = file_bytes;
  const auto* header = static_cast<const int32_t*>(map);
  if (header[0] != kShardMagic) {
    return Status::corruption("token shard " + path + ": bad magic number " + std::to_string(header[0]) +
                              ", expected " + std::to_string(kShardMagic) + " (not an llm.c token file?)");
  }
  if (header[1] != kShardVersion) {
    return Status::corruption("token shard " + path + ": unsupported version " + std::to_string(header[1]) +
                              ", expected " + std::to_string(kShardVersion));
  }
  const int64_t count = header[2];
  const int64_t expected_bytes = static_cast<int64_t>(kShardHeaderBytes) + 2 * count;
  if (count < 0 || static_cast<int64_t>(file_bytes) != expected_bytes) {
    return Status::corruption("token shard " + path + ": header says " + std::to_string(count) +
                              " tokens, so the file should be " + std::to_string(expected_bytes) +
                              " bytes, but it is " + std::to_string(file_bytes) + " bytes (truncated or corrupt)");
  }
  shard.tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map) + kShardHeaderBytes);
  shard.size_ = count;
  return shard;
}

TokenShard::TokenShard(TokenShard&& other) noexcept { *this = std::move(other); }

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
    max_token_.store(other.max_token_.exchange(kNotComputed));
  }
  return *this;
}

TokenShard::~TokenShard() { unmap(); }

int32_t TokenShard::max_token() const {
  int32_t m = max_token_.load(std::memory_order_relaxed);
  if (m == kNotComputed) {  // racing threads compute the same value; no lock needed
    m = size_ > 0 ? *std::max_element(tokens_, tokens_ + size_) : -1;
    max_token_.store(m, std::memory_order_relaxed);
  }
  return m;
}

void TokenShard::unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

}  // namespace gpt::data
