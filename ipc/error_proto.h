// Status <-> the wire's Error message. Code and v1::Code are the same numbers (ipc/codes.h); the
// asserts pin the range, tests/unit/wire_tables_test.cc every number and name.
#pragma once

#include "common/status.h"
#include "ipc/codes.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::ipc {

static_assert(v1::Code_MIN == static_cast<int>(Code::kOk) && v1::Code_MAX == static_cast<int>(Code::kInternal),
              "warmpool.v1.Code and warmpool::Code differ: change both, and ipc/codes.h");
static_assert(static_cast<size_t>(v1::Code_ARRAYSIZE) == kCodeTable.size(),
              "warmpool.v1.Code has a value without a row in ipc/codes.h");

inline v1::Code ToProto(Code code) { return static_cast<v1::Code>(static_cast<int>(code)); }
// A peer may send a value this build does not know (a newer one): it reads as INTERNAL.
inline Code FromProto(int value) { return CodeFromInt(value); }

inline void SetError(v1::Error* error, const Status& status) {
  error->set_code(ToProto(status.code()));
  error->set_message(status.message());
}

inline Status StatusFromError(const v1::Error& error) {
  return Status(FromProto(error.code()), error.message());
}

}  // namespace warmpool::ipc
