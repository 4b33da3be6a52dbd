// The benchmark's own warmpoold: spawned in a private temporary directory with a generated config
// that registers the echo engine, waited for until it answers, and stopped with SIGTERM.
#pragma once

#include "common/paths.h"

#include <sys/types.h>

#include <memory>
#include <string>

#include "client/client.h"
#include "common/status.h"

namespace warmpool::bench {

struct DaemonOptions {
  std::string binary;     // warmpoold
  std::string directory;  // private temporary directory: config, socket, models dir, log
  std::string instance;
  std::string backend;    // passed as --backend when not empty
  std::string model = "echo";
  // When not empty, the whole config file instead of the one registering `model` as echo.
  std::string config_text;
};

class Daemon {
 public:
  explicit Daemon(DaemonOptions options);
  ~Daemon();  // kills a daemon still running (SIGKILL) without waiting long

  // Writes the config and forks + execs warmpoold with its stderr in the log file.
  Status Spawn();
  // Until warmpoold answers a status request on its socket (or exits, or timeout_ms passes).
  Status WaitReady(int timeout_ms);
  // SIGTERM, then waits up to timeout_ms for it to exit (SIGKILL after that). Non-ok when it had to
  // be killed or exited with a failure status.
  Status Stop(int timeout_ms);
  // The last lines of the daemon's log, for error messages.
  std::string LogTail(size_t max_bytes = 4000) const;

  const std::string& socket_path() const { return socket_path_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

 private:
  DaemonOptions options_;
  std::string socket_path_;
  std::string config_path_;
  std::string log_path_;
  pid_t pid_ = -1;
};


}  // namespace warmpool::bench
