// The screen of `warmpool top` as lines of plain text (no escapes: the terminal code adds those),
// from a frame of the tracker and what top knows of the daemon. Pure, so that tests can read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "top/top_tracker.h"

namespace warmpool::top {

struct ViewContext {
  std::string version;
  std::string backend;
  std::string instance;
  // Empty when reading the segment; otherwise why top asks the daemon over the socket instead.
  std::string socket_reason;
  // Shown under the title line when set: the daemon went away, top is reconnecting.
  std::string alert;
  double refresh_seconds = 1;
  uint64_t now_unix_ns = 0;
};

// At most height lines (0: no limit), each at most width code points (0: no limit). A short
// screen loses model rows first (a line says how many), a narrow one loses columns.
std::vector<std::string> RenderFrame(const Frame& frame, const ViewContext& context, size_t width,
                                     size_t height);

}  // namespace warmpool::top
