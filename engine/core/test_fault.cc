#include "core/test_fault.h"

#include <charconv>
#include <cstdlib>

namespace gpt {

std::optional<TestFault> test_fault() {
  const char* env = std::getenv("GPT_TRAIN_FAULT");
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string_view text(env);
  TestFault f;
  size_t colon = text.find(':');
  f.kind = std::string(text.substr(0, colon));
  while (colon != std::string_view::npos) {
    const size_t begin = colon + 1;
    colon = text.find(':', begin);
    const std::string_view field = text.substr(begin, colon == std::string_view::npos ? colon : colon - begin);
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (ec != std::errc() || ptr != field.data() + field.size()) return std::nullopt;
    f.args.push_back(v);
  }
  return f;
}

}  // namespace gpt
