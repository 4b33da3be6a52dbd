// Status <-> the wire's Error message (the codes are equal numerically).
#pragma once

#include "common/status.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::ipc {

inline void SetError(v1::Error* error, const Status& status) {
  error->set_code(static_cast<v1::Code>(static_cast<int>(status.code())));
  error->set_message(status.message());
}

inline Status StatusFromError(const v1::Error& error) {
  return Status(CodeFromInt(error.code()), error.message());
}

}  // namespace warmpool::ipc
