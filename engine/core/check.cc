#include "core/check.h"

#include <spdlog/spdlog.h>

namespace gpt::internal {

void check_failed(const char* expr, const char* file, int line, const char* msg) {
  spdlog::critical("CHECK failed: {} at {}:{}{}{}", expr, file, line, msg ? ": " : "", msg ? msg : "");
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  std::abort();
}

}  // namespace gpt::internal
