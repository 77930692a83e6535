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

namespace gpt {
namespace {

// Sets one variable (or unsets it: null) for a scope, putting back what the caller had.
class EnvValue {
 public:
  EnvValue(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    value != nullptr ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~EnvValue() { had_ ? ::setenv(name_, saved_.c_str(), 1) : ::unsetenv(name_); }
  EnvValue(const EnvValue&) = delete;
  EnvValue& operator=(const EnvValue&) = delete;

 private:
  const char* name_;
  std::string saved_;
  bool had_ = false;
};

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
  std::vector<std::unique_ptr<EnvValue>> unset;  // this test's own settings only, the caller's put back after it
  for (const cuda_switches::Switch& s : cuda_switches::all())
    unset.push_back(std::make_unique<EnvValue>(s.name, nullptr));
  CHECK(cuda_switches::first_error().empty());
  for (const char* ok : {"0", "1", "fwd", "kv", "fwd,kv", "kv,fwd"}) {
    EnvValue v("GPT_ATTENTION_WGMMA_RS", ok);
    CAPTURE(ok);
    CHECK(cuda_switches::first_error().empty());
  }
  for (const char* bad : {"kvv", "fwd,", "dq", "yes", ""}) {
    EnvValue v("GPT_ATTENTION_WGMMA_RS", bad);
    CAPTURE(bad);
    CHECK(cuda_switches::first_error() == std::string("GPT_ATTENTION_WGMMA_RS=") + bad +
                                              " (tiles held in registers): expected 0, 1, or a comma-separated list "
                                              "of fwd or kv");
  }
  {
    EnvValue v("GPT_ATTENTION_WGMMA_WG2", "fwd,kv,dq");
    CHECK(cuda_switches::first_error().empty());
  }
  {
    EnvValue v("GPT_GEMM_ALGOS", "17");
    CHECK(cuda_switches::first_error().find("GPT_GEMM_ALGOS=17") == 0);
  }
  {
    EnvValue v("GPT_ATTENTION_WGMMA_BQ", "48");
    CHECK(cuda_switches::first_error() ==
          "GPT_ATTENTION_WGMMA_BQ=48 (the wgmma dK/dV kernel's queries per step): expected 32 or 64");
  }
  {
    EnvValue v("GPT_ATTENTION_WGMMA_OVERLAP", "bwd");
    CHECK(cuda_switches::first_error().empty());
  }
}

}  // namespace
}  // namespace gpt
