// What warmpool-worker and warmpool-owner say with their exit status, and how warmpoold reads it
// (supervisor/worker_pool.cc, supervisor/device_owners.cc). The status is part of the protocol
// between the supervisor and its children: a child that exits kFatal is not started again until the
// configuration changes, so a child must never use it for something that may pass.
//
// A usage error of any warmpool program exits 2 (common/command_line.h): for a child that is
// kFatal too, which is right, since the supervisor wrote that command line and starting the same
// binary again with it cannot succeed. tests/unit/wire_tables_test.cc holds the two together.
#pragma once

#include <cstdint>

namespace warmpool::ipc {

enum ChildExit : int {
  kChildStopped = 0,  // the supervisor closed the channel (or died first): a clean stop
  kChildFailed = 1,   // a crash in all but name, or a start that may succeed later: start it again
  kChildFatal = 2,    // configuration that starting again cannot fix: do not
};

// How the supervisor reads a child's end (libuv's exit callback): killed by a signal is never fatal.
constexpr bool IsFatalExit(int64_t exit_status, int term_signal) {
  return term_signal == 0 && exit_status == kChildFatal;
}

}  // namespace warmpool::ipc
