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
    Buffer c = std::move(b);
    REQUIRE(b.empty());
    REQUIRE(t.stats().current[i] == before.current[i] + 1500);
  }
  const auto after = t.stats();
  REQUIRE(after.current[i] == before.current[i]);
  REQUIRE(after.peak[i] == before.current[i] + 1500);
}

}  // namespace
}  // namespace gpt
