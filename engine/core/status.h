// Status and Expected<T>: the result of an operation that a user's input can make fail (config, I/O,
// corrupt data). A Status is either OK or an error code with a message that names the file, key or line
// and what was expected. Only apps/ turns a Status into a message on stderr and an exit code.
// Broken invariants are not Statuses: they go through GPT_CHECK (check.h) and abort.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace gpt {

enum class StatusCode { kOk = 0, kInvalidArgument, kNotFound, kIoError, kCorruption, kFailedPrecondition };

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status invalid_argument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
  static Status not_found(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status io_error(std::string msg) { return Status(StatusCode::kIoError, std::move(msg)); }
  static Status corruption(std::string msg) { return Status(StatusCode::kCorruption, std::move(msg)); }
  static Status failed_precondition(std::string msg) { return Status(StatusCode::kFailedPrecondition, std::move(msg)); }
  // An error of the given kind (another rank's, say); kOk or an unknown code gives an I/O error.
  static Status from_code(StatusCode code, std::string msg) {
    const bool known = code > StatusCode::kOk && code <= StatusCode::kFailedPrecondition;
    return Status(known ? code : StatusCode::kIoError, std::move(msg));
  }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "error kind: message", for logs.
  std::string to_string() const;
  // A copy with `prefix: ` put in front of the message (to add the file or key being processed).
  Status with_context(const std::string& prefix) const {
    return is_ok() ? *this : Status(code_, prefix + ": " + message_);
  }

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Either a value or a non-OK Status (C++20 has no std::expected).
template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  Expected(Status status) : v_(std::move(status)) {}  // NOLINT; REQUIRES: !status.is_ok()

  bool has_value() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return has_value(); }
  T& value() { return std::get<T>(v_); }
  const T& value() const { return std::get<T>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  Status status() const { return has_value() ? Status::ok() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpt

// Returns early from the enclosing function if `expr` yields a non-OK Status.
#define GPT_RETURN_IF_ERROR(expr) \
  do {                            \
    ::gpt::Status _st = (expr);   \
    if (!_st.is_ok()) return _st; \
  } while (0)

#define GPT_CONCAT_INNER(a, b) a##b
#define GPT_CONCAT(a, b) GPT_CONCAT_INNER(a, b)
// `GPT_ASSIGN_OR_RETURN(auto x, make_x());` declares x from an Expected or returns its Status.
#define GPT_ASSIGN_OR_RETURN(decl, expr) GPT_ASSIGN_OR_RETURN_IMPL(GPT_CONCAT(_exp_, __LINE__), decl, expr)
#define GPT_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
  auto tmp = (expr);                               \
  if (!tmp.has_value()) return tmp.status();       \
  decl = std::move(tmp.value())
