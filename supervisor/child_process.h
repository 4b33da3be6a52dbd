// How the supervisor starts its helper processes (workers, device owners): fork+exec through
// libuv, the channel on descriptor 3, stdout and stderr shared with the supervisor, stdin closed,
// and none of the service manager's variables in the environment (only the supervisor talks to
// systemd: a child that saw NOTIFY_SOCKET could report readiness for it).
#pragma once

#include <string>
#include <vector>

#include <uv.h>

namespace warmpool::supervisor {

// This process's environment less the service manager's variables, null-terminated for exec.
std::vector<char*> ChildEnvironment();

// uv_spawn's result: 0, or a libuv error (the handle is initialised either way and must be closed).
int SpawnChild(uv_loop_t* loop, uv_process_t* process, const std::vector<std::string>& args, int channel_fd,
               uv_exit_cb on_exit);

}  // namespace warmpool::supervisor
