#include "core/allocator.h"

#include <catch2/catch.hpp>

namespace gpt {
namespace {

TEST_CASE("Tracked allocator counts current and peak bytes per category", "[core]") {
  auto& t = MemTracker::instance();
  t.reset_peaks();
  const auto before = t.stats();
  const size_t i = static_cast<size_t>(MemCategory::kActivations);
  {
    Buffer a(1000, MemCategory::kActivations);
    Buffer b(500, MemCategory::kActivations);
    REQUIRE(reinterpret_cast<uintptr_t>(a.data()) % 64 == 0);
    REQUIRE(t.stats().current[i] == before.current[i] + 1500);
    REQUIRE(t.stats().live_buffers == before.live_buffers + 2);
    Buffer c = std::move(b);
    REQUIRE(b.empty());
    REQUIRE(t.stats().current[i] == before.current[i] + 1500);
    REQUIRE(t.stats().live_buffers == before.live_buffers + 2);  // a move is not another buffer
    Buffer none(0, MemCategory::kActivations);
    REQUIRE(t.stats().live_buffers == before.live_buffers + 2);  // nor is an empty one
  }
  const auto after = t.stats();
  REQUIRE(after.current[i] == before.current[i]);
  REQUIRE(after.live_buffers == before.live_buffers);
  REQUIRE(after.allocations == before.allocations + 2);
  REQUIRE(after.peak[i] == before.current[i] + 1500);
}

}  // namespace
}  // namespace gpt
