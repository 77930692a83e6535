// The order in which the causal attention kernels take their tiles. Each kernel's grid has one block per (tile,
// head): a forward or dQ block takes a query tile and the keys before it, a dK/dV block a key tile and the queries
// after it, so a head's tiles differ in work by up to T/64 times, and a GPU starts blocks in about their linear
// order (x fastest). Head by head (the grid as it reads: every tile of head 0, longest first, then head 1, ...)
// leaves the last heads' long tiles for the end, on a few SMs: at GPT-2's shape (T 1024, 16 tiles a head) and 5
// blocks per SM, a model of the SMs' slots as queues puts the last block's end 26% past the mean at batch 16 and 6%
// at batch 64. Longest first over all heads (the rank-0 tiles of every head, then the rank-1 tiles, ...; FA3's LPT
// order) ends the grid on the shortest tiles instead (4% and 0.5% in that model), but spreads the running blocks
// over every head, and each head's K and V (or Q and dO) are read by all of its blocks: across the L2 cache while
// they run together. So the heads go in sections whose tiles fit half of L2, each section longest first, the
// sections one after the other (the model: 4% and 1%). Plain C++ with GPT_HOST_DEVICE, so the CPU tests check it.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace gpt::cuda {

// A block's tile: `rank` 0 is its head's tile with the most work (the last query tile, the first key tile), and
// `bh` the (batch, head) it belongs to (b * NH + h).
struct CausalTile {
  int rank, bh;
};

// The tile of block (bx, by) in a grid of (tiles, heads) blocks. section_heads 0: head by head ({bx, by}); else the
// heads in sections of section_heads (the last one may hold fewer), and within a section every head's rank-0 tile,
// then every head's rank-1 tile, and so on (section_heads past `heads`: one section). In 32 bits (a 64-bit division
// is a long software routine in a kernel): REQUIRES tiles * heads < 2^32 (attention_sections gives 0 past that).
GPT_HOST_DEVICE inline CausalTile causal_tile(uint32_t bx, uint32_t by, uint32_t tiles, uint32_t heads,
                                              int section_heads) {
  if (section_heads <= 0) return {static_cast<int>(bx), static_cast<int>(by)};
  const uint32_t per = static_cast<uint32_t>(section_heads) < heads ? static_cast<uint32_t>(section_heads) : heads;
  const uint32_t linear = by * tiles + bx;
  const uint32_t first = linear / (tiles * per) * per;           // the section's first head
  const uint32_t n = heads - first < per ? heads - first : per;  // the section's heads
  const uint32_t r = linear - first * tiles;                     // the block's place in its section
  return {static_cast<int>(r / n), static_cast<int>(first + r % n)};
}

// Heads per section: as many as put `head_bytes` each (the K and V, or Q and dO, a head's blocks read) within half
// of `l2_bytes` (the rest for the tiles streamed once: Q and O, dS^T), at least 1; then the same number of sections
// made as even as they go (192 heads that fit 100 at a time: two sections of 96, not 100 and 92).
inline int causal_section_heads(int64_t heads, int64_t head_bytes, int64_t l2_bytes) {
  if (heads <= 1) return 1;
  const int64_t fit = head_bytes > 0 && l2_bytes / 2 / head_bytes > 1 ? l2_bytes / 2 / head_bytes : 1;
  const int64_t sections = (heads + fit - 1) / fit;
  return static_cast<int>((heads + sections - 1) / sections);
}

}  // namespace gpt::cuda
