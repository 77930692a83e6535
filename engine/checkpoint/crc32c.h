// CRC-32C (Castagnoli), the checksum recorded for every checkpoint shard file.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpt {

// Continues a running checksum: crc32c(b, crc32c(a)) == crc32c(a ++ b). Start with crc = 0.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace gpt
