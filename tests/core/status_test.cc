#include "core/status.h"

#include <catch2/catch.hpp>

namespace gpt {
namespace {

Expected<int> parse_positive(int v) {
  if (v <= 0) return Status::invalid_argument("expected a positive value, got " + std::to_string(v));
  return v;
}

Status use(int v, int* out) {
  GPT_ASSIGN_OR_RETURN(int x, parse_positive(v));
  *out = x * 2;
  return Status::ok();
}

TEST_CASE("Status and Expected carry errors and values", "[core]") {
  int out = 0;
  REQUIRE(use(3, &out).is_ok());
  REQUIRE(out == 6);
  Status st = use(-1, &out);
  REQUIRE_FALSE(st.is_ok());
  REQUIRE(st.code() == StatusCode::kInvalidArgument);
  REQUIRE(st.with_context("model.n_head").message() == "model.n_head: expected a positive value, got -1");
  REQUIRE(st.to_string().rfind("invalid argument: ", 0) == 0);
}

}  // namespace
}  // namespace gpt
