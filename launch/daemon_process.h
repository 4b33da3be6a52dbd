// A warmpoold started and watched from outside: by the integration tests, the fault-injection
// harness and the benchmark (one launcher for all three). It writes nothing but the daemon's log;
// the caller writes the config and the models it wants first.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace warmpool::launch {

struct DaemonSpec {
  std::string binary;       // warmpoold (or a program that starts it, e.g. a socket activator)
  std::string directory;    // its working directory
  std::string socket;       // where it serves: passed as --socket unless socket_passed is false
  bool socket_passed = true;
  std::string instance;     // --instance when not empty
  std::string config;       // --config when not empty
  std::string models_dir;   // --models-dir when not empty
  std::vector<std::string> args;  // more arguments (--enable-fault-injection, --backend host, ...)
  std::vector<std::string> env;   // KEY=VALUE added to its environment
  // Descriptors passed the way systemd passes them (sd_listen_fds(3)): as 3, 4, ... with
  // LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (the daemon's own pid) set; (descriptor, name).
  std::vector<std::pair<int, std::string>> listen_fds;
  uint64_t nofile = 0;      // RLIMIT_NOFILE when not 0
  bool die_with_parent = false;   // SIGTERM to it if this process dies (PR_SET_PDEATHSIG)
  std::string log;          // stdout and stderr; default <directory>/daemon.log
};

class DaemonProcess {
 public:
  explicit DaemonProcess(DaemonSpec spec);
  ~DaemonProcess();  // a daemon still running is killed (SIGKILL) and reaped
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;

  // fork + exec; the log is appended to.
  Status Start();
  // Until a status request is answered on the socket (and, when asked, every worker is idle);
  // UNAVAILABLE with its log's end when it exited, DEADLINE_EXCEEDED after timeout_ms.
  Status WaitReady(int timeout_ms, bool workers_idle = false);
  // SIGTERM, then its exit: the exit status (128 + signal for a signal), or -1 when it did not
  // exit within timeout_ms (it is then killed).
  int Stop(int timeout_ms = 30000);
  // The exit of a daemon already told to stop; -1 as Stop.
  int Wait(int timeout_ms = 30000);
  // SIGKILL and reap (as a crash would): its segment and socket stay behind.
  void Kill();
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  const DaemonSpec& spec() const { return spec_; }
  std::string Log() const;
  std::string LogTail(size_t max_bytes = 4000) const;

 private:
  DaemonSpec spec_;
  pid_t pid_ = -1;
};

// "exited with status 1", "was killed by signal 9".
std::string DescribeExit(int wait_status);

// A child of `parent` whose command name (/proc/PID/comm, at most 15 characters) is `name`, such as
// the daemon's "warmpool-owner", and whose command line holds `args` in a row ({"--device", "1"});
// -1 when there is none.
pid_t ChildNamed(pid_t parent, const std::string& name, const std::vector<std::string>& args = {});

}  // namespace warmpool::launch
