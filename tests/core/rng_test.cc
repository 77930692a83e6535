#include "core/rng.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "core/dtype.h"

namespace gpt {
namespace {

TEST_CASE("Philox4x32-10 matches the Random123 known-answer vectors", "[core]") {
  // From Random123's kat_vectors: philox4x32_10 with zero and all-ones inputs.
  auto z = Philox::generate({0, 0, 0, 0}, {0, 0});
  REQUIRE(z == Philox::Counter{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  auto f = Philox::generate({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  REQUIRE(f == Philox::Counter{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
}

TEST_CASE("CounterRng is a pure function of (seed, stream, index) with sane moments", "[core]") {
  CounterRng a(1337, 7), b(1337, 7), c(1337, 8);
  REQUIRE(a.normal(12345) == b.normal(12345));
  REQUIRE(a.normal(12345) != c.normal(12345));
  double sum = 0, sq = 0, usum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = a.normal(i);
    sum += x;
    sq += x * x;
    usum += a.uniform(i);
  }
  REQUIRE(std::abs(sum / n) < 0.01);
  REQUIRE(std::abs(sq / n - 1.0) < 0.02);
  REQUIRE(std::abs(usum / n - 0.5) < 0.005);
}

TEST_CASE("bf16 conversion rounds to nearest even", "[core]") {
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  REQUIRE(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  REQUIRE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

}  // namespace
}  // namespace gpt
