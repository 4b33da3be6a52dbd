// Wake-ups per request, counted by the kernel: the context switches (voluntary and not) of every
// thread of a process and of its children, read from /proc. Unlike latency they do not depend on
// how busy the machine is, so they say where a path spends hops even on a noisy host.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace warmpool::bench {

// The process and its children (one level: the daemon's workers).
std::vector<pid_t> WithChildren(pid_t pid);
// Context switches of every thread of these processes so far.
uint64_t ContextSwitches(const std::vector<pid_t>& pids);

}  // namespace warmpool::bench
