// What a fault is, shared by the supervisor (which validates and arms) and the worker (which fires).
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace warmpool::ipc {

// The fault points in the worker, in the order a request meets them.
inline constexpr const char* kFaultPoints[] = {
    "load.begin",       "load.after_alloc", "load.mid_copy",        "load.before_ready",
    "infer.after_take", "infer.mid",        "infer.before_restore", "unload.mid",
    "attach.mid",       "park.mid",
};

Status CheckFaultPoint(std::string_view point);
// "kill", "segv", "abort", "hang", "exit:N" (0..255), "delay:MS".
Status CheckFaultAction(std::string_view action);
bool ParseFaultNumber(std::string_view text, uint32_t& out);

}  // namespace warmpool::ipc
