#include "common/status.h"

#include <cerrno>

namespace warmpool {

// The names of ipc/codes.h, which common/ cannot include (it is below ipc/ in the link order):
// tests/unit/wire_tables_test.cc holds the two together.
std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
    case Code::kInternal: return "INTERNAL";
  }
  return "INTERNAL";
}

Code CodeFromInt(int value) {
  if (value < 0 || value > static_cast<int>(Code::kInternal)) return Code::kInternal;
  return static_cast<Code>(value);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", CodeName(code_), message_);
}

Code CodeForErrno(int err) {
  switch (err) {
    case ENOENT: case ENOTDIR: return Code::kNotFound;
    case EACCES: case EPERM: case EROFS: return Code::kPermissionDenied;
    case ENOSPC: case EDQUOT: case ENOMEM: return Code::kResourceExhausted;
    default: return Code::kInternal;
  }
}

}  // namespace warmpool
