#include "core/status.h"

namespace gpt {

std::string Status::to_string() const {
  const char* kind = "OK";
  switch (code_) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: kind = "invalid argument"; break;
    case StatusCode::kNotFound: kind = "not found"; break;
    case StatusCode::kIoError: kind = "I/O error"; break;
    case StatusCode::kCorruption: kind = "corruption"; break;
    case StatusCode::kFailedPrecondition: kind = "failed precondition"; break;
  }
  return std::string(kind) + ": " + message_;
}

}  // namespace gpt
