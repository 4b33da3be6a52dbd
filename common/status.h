// The one error model of warmpool: a Code from a fixed list modelled on gRPC's and a message that
// tells the reader what to do. Module APIs return Status or Result<T>; no exception crosses a module
// boundary or the event loop.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace warmpool {

// Values match warmpool.v1.Code on the wire. ipc/codes.h is the table of what each code becomes at
// every boundary (name, HTTP status, CLI exit, Python exception); a new code is added there too.
enum class Code : int {
  kOk = 0,
  kNotFound = 1,
  kInvalidArgument = 2,
  kResourceExhausted = 3,
  kUnavailable = 4,
  kDeadlineExceeded = 5,
  kFailedPrecondition = 6,
  kPermissionDenied = 7,
  kInternal = 8,
};

// "NOT_FOUND", "INVALID_ARGUMENT", ... as printed by the CLI.
std::string_view CodeName(Code code);
// Codes read off the wire may be anything; unknown values become kInternal.
Code CodeFromInt(int value);
// The code for a failed file operation's errno: missing, not allowed, out of space, or internal.
Code CodeForErrno(int err);

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NOT_FOUND: model "x" is not registered (see 'warmpool models')"
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status OkStatus() { return {}; }

template <typename... Args>
Status Error(Code code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

// A value or the Status that explains why there is none.
template <typename T>
class Result {
 public:
  Result(T value) : data_(std::move(value)) {}            // NOLINT: implicit by design
  Result(Status status) : data_(std::move(status)) {}     // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(data_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(data_);
  }
  T& value() & { return std::get<T>(data_); }
  const T& value() const& { return std::get<T>(data_); }
  T&& value() && { return std::get<T>(std::move(data_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> data_;
};

}  // namespace warmpool
