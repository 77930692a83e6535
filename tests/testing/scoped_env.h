// An environment variable set (or unset) for a scope, and what the caller had put back after it: for tests of the
// switches the code reads from the environment, which may run under values a user exported.
#pragma once

#include <cstdlib>
#include <string>

namespace gpt::testing {

class ScopedEnv {
 public:
  // value null: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = old, had_ = true;
    set(value);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_.c_str(), saved_.c_str(), 1) : ::unsetenv(name_.c_str()); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  void set(const char* value) { value != nullptr ? ::setenv(name_.c_str(), value, 1) : ::unsetenv(name_.c_str()); }

 private:
  std::string name_;
  std::string saved_;
  bool had_ = false;
};

}  // namespace gpt::testing
