#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace gpt {

void init_logging(int rank, const std::string& level, bool all_ranks) {
  const std::string name = "gpt-train-" + std::to_string(rank);
  spdlog::drop(name);
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v");
  spdlog::level::level_enum lvl = spdlog::level::from_str(level);
  if (rank != 0 && !all_ranks && lvl < spdlog::level::warn) lvl = spdlog::level::warn;
  logger->set_level(lvl);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(logger);
}

void log_warning(const std::string& message) { spdlog::warn("{}", message); }
void log_info(const std::string& message) { spdlog::info("{}", message); }

}  // namespace gpt
