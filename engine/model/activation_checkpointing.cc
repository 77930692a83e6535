#include "model/activation_checkpointing.h"

#include <charconv>

namespace gpt {

Expected<ActivationCheckpointing> ActivationCheckpointing::parse(const std::string& text) {
  ActivationCheckpointing ac;
  if (text == "none") return ac;
  if (text == "full") {
    ac.mode = Mode::kFull;
    return ac;
  }
  if (text == "selective") {
    ac.mode = Mode::kSelective;
    return ac;
  }
  if (text.rfind("every:", 0) == 0) {
    const char* first = text.data() + 6;
    const char* last = text.data() + text.size();
    int n = 0;
    auto [ptr, ec] = std::from_chars(first, last, n);
    if (ec == std::errc() && ptr == last && n >= 1) {
      ac.mode = Mode::kEveryN;
      ac.every = n;
      return ac;
    }
  }
  return Status::invalid_argument("expected one of none|full|selective|every:N (N >= 1), got '" + text + "'");
}

std::string ActivationCheckpointing::to_string() const {
  switch (mode) {
    case Mode::kNone: return "none";
    case Mode::kFull: return "full";
    case Mode::kSelective: return "selective";
    case Mode::kEveryN: return "every:" + std::to_string(every);
  }
  return "?";
}

}  // namespace gpt
