#include "supervisor/child_process.h"

#include <cstring>

extern char** environ;

namespace warmpool::supervisor {

std::vector<char*> ChildEnvironment() {
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; e++) {
    if (std::strncmp(*e, "NOTIFY_SOCKET=", 14) == 0 || std::strncmp(*e, "LISTEN_", 7) == 0 ||
        std::strncmp(*e, "WATCHDOG_", 9) == 0) {
      continue;
    }
    env.push_back(*e);
  }
  env.push_back(nullptr);
  return env;
}

int SpawnChild(uv_loop_t* loop, uv_process_t* process, const std::vector<std::string>& args, int channel_fd,
               uv_exit_cb on_exit) {
  std::vector<std::string> owned = args;
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> env = ChildEnvironment();
  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = 1;
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = channel_fd;
  uv_process_options_t options{};
  options.file = argv[0];
  options.args = argv.data();
  options.env = env.data();
  options.stdio = stdio;
  options.stdio_count = 4;
  options.exit_cb = on_exit;
  return uv_spawn(loop, process, &options);
}

}  // namespace warmpool::supervisor
