// kernels/cuda/tile_order.h: the causal attention kernels' block -> (tile, head) map and its sections, on the CPU.
#include "kernels/cuda/tile_order.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <queue>
#include <sstream>
#include <string>
#include <vector>

namespace gpt {
namespace {

using cuda::causal_section_heads;
using cuda::causal_tile;
using cuda::CausalTile;

// Every block of a (tiles, heads) grid, in linear order (x fastest), mapped.
std::vector<CausalTile> blocks(unsigned tiles, unsigned heads, int section_heads) {
  std::vector<CausalTile> out;
  for (unsigned by = 0; by < heads; ++by)
    for (unsigned bx = 0; bx < tiles; ++bx) out.push_back(causal_tile(bx, by, tiles, heads, section_heads));
  return out;
}

TEST_CASE("tile order: head by head is the grid as it reads", "[tile_order]") {
  const std::vector<CausalTile> b = blocks(3, 4, 0);
  for (size_t i = 0; i < b.size(); ++i) {
    CHECK(b[i].rank == static_cast<int>(i % 3));
    CHECK(b[i].bh == static_cast<int>(i / 3));
  }
}

TEST_CASE("tile order: sections take every tile once, longest first within each", "[tile_order]") {
  for (const unsigned tiles : {1u, 2u, 3u, 16u}) {
    for (const unsigned heads : {1u, 2u, 5u, 7u, 192u}) {
      for (const int section : {1, 2, 3, 4, 96, 500}) {
        CAPTURE(tiles, heads, section);
        const std::vector<CausalTile> b = blocks(tiles, heads, section);
        std::vector<int> seen(static_cast<size_t>(tiles) * heads, 0);
        bool in_range = true, ordered = true, grouped = true;
        for (size_t i = 0; i < b.size(); ++i) {
          const CausalTile t = b[i];
          if (t.rank < 0 || t.rank >= static_cast<int>(tiles) || t.bh < 0 || t.bh >= static_cast<int>(heads)) {
            in_range = false;
            continue;
          }
          ++seen[static_cast<size_t>(t.bh) * tiles + t.rank];
          // Block i lies in section i / (tiles * section): its heads are that section's, and its rank is at least
          // the previous block's there (every head's rank r before any head's rank r + 1).
          const int64_t s = static_cast<int64_t>(i) / (static_cast<int64_t>(tiles) * section);
          if (t.bh / section != s) grouped = false;
          if (i > 0 && static_cast<int64_t>(i - 1) / (static_cast<int64_t>(tiles) * section) == s &&
              b[i - 1].rank > t.rank)
            ordered = false;
        }
        CHECK(in_range);
        CHECK(grouped);
        CHECK(ordered);
        CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<int64_t>(seen.size()));
      }
    }
  }
  // Within a section the heads take turns: 5 heads in sections of 2 (2, 2, 1), 3 tiles each.
  const std::vector<CausalTile> b = blocks(3, 5, 2);
  const std::vector<int> rank = {0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0, 1, 2};
  const std::vector<int> head = {0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 4, 4, 4};
  for (size_t i = 0; i < b.size(); ++i) {
    CAPTURE(i);
    CHECK(b[i].rank == rank[i]);
    CHECK(b[i].bh == head[i]);
  }
}

TEST_CASE("tile order: sections fit half of L2, as even as they go", "[tile_order]") {
  const int64_t mb = 1 << 20, head = 2 * 1024 * 64 * 2;    // K and V of one GPT-2 head at T 1024, bf16: 256 KB
  CHECK(causal_section_heads(192, head, 50 * mb) == 96);   // 100 fit: two sections of 96
  CHECK(causal_section_heads(768, head, 50 * mb) == 96);   // eight of 96
  CHECK(causal_section_heads(100, head, 50 * mb) == 100);  // one
  CHECK(causal_section_heads(101, head, 50 * mb) == 51);   // two: 51 and 50
  CHECK(causal_section_heads(10, 1000, 8000) == 4);        // 4 fit: 3 sections of 4, 4, 2
  CHECK(causal_section_heads(5, 1000, 1000) == 1);         // a head larger than half of L2: one at a time
  CHECK(causal_section_heads(5, 0, 1000) == 1);            // no size known
  CHECK(causal_section_heads(1, head, 50 * mb) == 1);
  CHECK(causal_section_heads(0, head, 50 * mb) == 1);
}

// The reason for the order (tile_order.h's numbers): blocks started in linear order on the first free one of
// `slots` (132 SMs x 5 blocks), each taking its tile's key tiles plus 0.3 for its start and end. GPT-2's shape (16
// tiles a head) at batch 16: head by head ends 26% past the mean load, the sections of causal_section_heads 4%.
double makespan_over_mean(unsigned tiles, unsigned heads, int section, int slots) {
  std::priority_queue<double, std::vector<double>, std::greater<>> free_at;
  for (int s = 0; s < slots; ++s) free_at.push(0.0);
  double end = 0, total = 0;
  for (const CausalTile t : blocks(tiles, heads, section)) {
    const double work = tiles - t.rank + 0.3;  // rank 0 has every key tile
    const double done = free_at.top() + work;
    free_at.pop();
    free_at.push(done);
    end = std::max(end, done);
    total += work;
  }
  return end / (total / slots);
}

TEST_CASE("tile order: the sections end a GPT-2-sized grid near its mean load, head by head does not", "[tile_order]") {
  const int64_t head = 2 * 1024 * 64 * 2, l2 = int64_t{50} << 20;
  for (const unsigned batch : {16u, 64u}) {
    CAPTURE(batch);
    const unsigned heads = 12 * batch;
    const double by_head = makespan_over_mean(16, heads, 0, 660);
    const double by_section = makespan_over_mean(16, heads, causal_section_heads(heads, head, l2), 660);
    CHECK(by_section < 1.05);
    CHECK(by_head > by_section + 0.04);
  }
}

// A kernel that kept its own block -> tile map computes every tile all the same, so the bit-for-bit tests cannot see
// it: it would only lose the order. Every tiled attention kernel in kernels/cuda takes its tile from causal_tile
// (the 15 kernel bodies: 3 in attention.cu, 3 in attention_tc.cu, 1 in attention_mma.cu, 3 in
// attention_mma_backward.cu, 2 in attention_wgmma.cu, 2 in attention_wgmma_backward.cu, 1 in attention_wgmma_ws.cu),
// and none from blockIdx.y as a head.
TEST_CASE("tile order: every tiled attention kernel takes its tile from causal_tile", "[tile_order]") {
  const std::string call = "causal_tile(blockIdx.x, blockIdx.y, gridDim.x, gridDim.y, sections)";
  int calls = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(GPT_SOURCE_DIR) + "/kernels/cuda")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("attention", 0) != 0) continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    CAPTURE(name);
    CHECK(s.find("= blockIdx.y") == std::string::npos);
    for (size_t at = s.find(call); at != std::string::npos; at = s.find(call, at + 1)) ++calls;
  }
  CHECK(calls == 15);
}

}  // namespace
}  // namespace gpt
