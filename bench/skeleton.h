// What every mode of warmpool-bench needs around its measurements: a private scratch directory, a
// private warmpoold in it started on the mode's configuration, clients of it, and the cleanup of
// all of it on any exit — an error, a normal end, SIGINT or SIGTERM (children stopped, files
// removed) — so that an interrupted run leaves nothing behind.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>

#include "client/client.h"
#include "common/status.h"
#include "launch/daemon_process.h"
#include "launch/service_manager_double.h"

namespace warmpool::bench {

class BenchRun {
 public:
  BenchRun();
  ~BenchRun();  // stops the daemon and the children, removes the directory
  BenchRun(const BenchRun&) = delete;
  BenchRun& operator=(const BenchRun&) = delete;

  // The mode's body, run with a scratch directory ready; prints an error ("warmpool-bench MODE:
  // error: ...", MODE the flags that chose it, "--generate --streams" say) and returns the exit
  // status (0, or 1 after an error).
  static int Main(const std::string& mode, const std::function<Status(BenchRun&)>& body);

  const std::string& dir() const { return dir_; }
  // A file of the mode's in the directory, removed on any exit (a model file can be large).
  std::string File(const std::string& name);
  // Writes the configuration and starts warmpoold (binary: empty for the one next to this
  // program) on it; returns when it answers. Every fork happens before the mode starts threads.
  Status StartDaemon(const std::string& binary, const std::string& backend,
                     const std::string& config_text);
  // Under a stand-in for systemd (launch/service_manager_double.h): every start after this one
  // gets what it keeps. Call before StartDaemon.
  void UseServiceManager(launch::ServiceManagerDouble* manager) { manager_ = manager; }
  // SIGKILL the daemon (as a crash would), then fork+exec a new one on the same configuration and
  // socket without waiting for it: the caller times what follows.
  Status KillAndStartAgain();
  launch::DaemonProcess& daemon() { return *daemon_; }
  // A client of the daemon that gives up on a reply after a minute (a failsafe, not a bound).
  Result<std::unique_ptr<client::Client>> Connect() const;
  // The status with the end of the daemon's log, for errors.
  Status WithLog(const Status& status) const;
  // SIGTERM and the exit: non-ok when it did not stop cleanly.
  Status StopDaemon();
  // Another child (a baseline server): killed on any exit.
  void AddChild(pid_t pid);
  void StopChildren();

 private:
  Status MakeScratch();
  void Cleanup();

  std::string dir_;
  std::unique_ptr<launch::DaemonProcess> daemon_;
  launch::ServiceManagerDouble* manager_ = nullptr;
};

// s as the inside of a JSON string, for the modes' --json lines: quotes, backslashes and control
// characters escaped.
std::string JsonEscape(const std::string& s);

}  // namespace warmpool::bench
