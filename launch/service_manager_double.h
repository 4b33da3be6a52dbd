// A stand-in for systemd's side of sd_notify(3) and of the file-descriptor store, for the tests,
// the fault-injection harness and the benchmark (no systemd runs as PID 1 on the machines they run
// on). It binds a datagram socket that a daemon is told of with NOTIFY_SOCKET and keeps what it is
// sent there, the way systemd does: notifications (READY=1, STATUS=, ...), and descriptors sent with
// FDSTORE=1 kept under their FDNAME= until FDSTOREREMOVE=1 names them. The next start gets the
// descriptors kept back as systemd gives them: as 3, 4, ... with LISTEN_FDS, LISTEN_FDNAMES and
// LISTEN_PID (PrepareStart). A thread reads the socket all along, so a sender never blocks on it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "launch/daemon_process.h"

namespace warmpool::launch {

class ServiceManagerDouble {
 public:
  // The socket is bound at `path` (which must not exist); `max_fds` as FileDescriptorStoreMax=:
  // a descriptor beyond it is refused (closed), as systemd does.
  static Result<std::unique_ptr<ServiceManagerDouble>> Open(const std::string& path, size_t max_fds = 1024);
  ~ServiceManagerDouble();
  ServiceManagerDouble(const ServiceManagerDouble&) = delete;
  ServiceManagerDouble& operator=(const ServiceManagerDouble&) = delete;

  // NOTIFY_SOCKET for the spec, and the descriptors kept as its LISTEN_FDS. The descriptors stay
  // the store's (systemd keeps its own copies while the service runs).
  void PrepareStart(DaemonSpec& spec);
  // Everything received so far, one datagram each (descriptors left out).
  std::vector<std::string> Notifications() const;
  // Name -> how many descriptors are kept under it.
  std::map<std::string, size_t> Stored() const;
  size_t stored_count() const;
  // `systemctl stop`: the store is emptied.
  void Clear();

 private:
  ServiceManagerDouble(int fd, std::string path, size_t max_fds);
  void ReadLoop();
  void Take(const std::string& message, std::vector<int>& fds);

  int fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::string path_;
  size_t max_fds_;
  mutable std::mutex mutex_;
  std::vector<std::string> notifications_;
  std::vector<std::pair<std::string, int>> stored_;  // in the order stored, as systemd passes them
  std::thread reader_;
};

}  // namespace warmpool::launch
