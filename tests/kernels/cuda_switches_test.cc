#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/switches.h"
#include "testing/scoped_env.h"

namespace gpt {
namespace {

using testing::ScopedEnv;

TEST_CASE("CUDA switches: every GPT_ variable kernels/cuda reads is in the table", "[cuda_switches]") {
  std::set<std::string> table;
  for (const cuda_switches::Switch& s : cuda_switches::all()) table.insert(s.name);
  const std::regex quoted("\"(GPT_[A-Z0-9_]+)\"");
  std::set<std::string> read;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(GPT_SOURCE_DIR) + "/kernels/cuda")) {
    if (entry.path().filename() == "switches.h") continue;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (std::sregex_iterator it(s.begin(), s.end(), quoted), end; it != end; ++it) read.insert((*it)[1].str());
  }
  REQUIRE(read.size() >= 10);  // the scan found the switches (GPT_ATTENTION_WGMMA_RS among them)
  CHECK(read.count("GPT_ATTENTION_WGMMA_RS") == 1);
  for (const std::string& name : read) {
    CAPTURE(name);
    CHECK(table.count(name) == 1);
  }
}

TEST_CASE("CUDA switches: a value no switch takes is named with what it takes", "[cuda_switches]") {
  std::vector<std::unique_ptr<ScopedEnv>> unset;  // this test's own settings only, the caller's put back after it
  for (const cuda_switches::Switch& s : cuda_switches::all())
    unset.push_back(std::make_unique<ScopedEnv>(s.name, nullptr));
  CHECK(cuda_switches::first_error().empty());
  for (const char* ok : {"0", "1", "fwd", "kv", "fwd,kv", "kv,fwd"}) {
    ScopedEnv v("GPT_ATTENTION_WGMMA_RS", ok);
    CAPTURE(ok);
    CHECK(cuda_switches::first_error().empty());
  }
  for (const char* bad : {"kvv", "fwd,", "dq", "yes", ""}) {
    ScopedEnv v("GPT_ATTENTION_WGMMA_RS", bad);
    CAPTURE(bad);
    CHECK(cuda_switches::first_error() == std::string("GPT_ATTENTION_WGMMA_RS=") + bad +
                                              " (tiles held in registers): expected 0, 1, or a comma-separated list "
                                              "of fwd or kv");
  }
  {
    ScopedEnv v("GPT_ATTENTION_WGMMA_WG2", "fwd,kv,dq");
    CHECK(cuda_switches::first_error().empty());
  }
  {
    ScopedEnv v("GPT_GEMM_ALGOS", "17");
    CHECK(cuda_switches::first_error().find("GPT_GEMM_ALGOS=17") == 0);
  }
  {
    ScopedEnv v("GPT_ATTENTION_WGMMA_BQ", "48");
    CHECK(cuda_switches::first_error() ==
          "GPT_ATTENTION_WGMMA_BQ=48 (the wgmma dK/dV kernel's queries per step): expected 32, 64 or 128");
  }
  {
    ScopedEnv v("GPT_ATTENTION_WGMMA_OVERLAP", "bwd");
    CHECK(cuda_switches::first_error().empty());
  }
  {
    ScopedEnv v("GPT_GEMM_ALGO_CACHE", "/any/path, even this");  // a path: any value
    CHECK(cuda_switches::first_error().empty());
  }
}

}  // namespace
}  // namespace gpt
