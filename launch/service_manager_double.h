// A stand-in for systemd's side of sd_notify(3) and of the file-descriptor store, for the tests,
// the fault-injection harness and the benchmark (no systemd runs as PID 1 on the machines they run
// on). It binds a datagram socket that a daemon is told of with NOTIFY_SOCKET and keeps what it is
// sent there, the way systemd does: notifications (READY=1, STATUS=, ...), and descriptors sent with
// FDSTORE=1 kept under their FDNAME= until FDSTOREREMOVE=1 names them. The next start gets the
// descriptors kept back as systemd gives them: as 3, 4, ... with LISTEN_FDS, LISTEN_FDNAMES and
// LISTEN_PID (PrepareStart). A thread reads the socket all along, so a sender never blocks on it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "ipc/warm_store.pb.h"
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
  // the store's (systemd keeps its own copies while the service runs). Every message sent before
  // the call is taken first, as systemd reads what a service sent before it handles its exit.
  void PrepareStart(DaemonSpec& spec);
  // Returns once every message sent to the socket before the call has been taken.
  void Settle();
  // Until the store is what a warmpoold leaves when it is up to date (supervisor/warm_store.h) and
  // its manifest satisfies `done`: one manifest, naming exactly the other descriptors kept.
  // Counting names is not enough: a daemon stores a handle before the manifest that names it, and
  // dies between the two as easily as anywhere. False after `timeout`.
  bool WaitForKept(const std::function<bool(const v1::KeptManifest&)>& done, std::chrono::milliseconds timeout);
  // ... naming `handles` descriptors.
  bool WaitForKept(size_t handles, std::chrono::milliseconds timeout);
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
  // The manifest, when the store holds one naming exactly the other descriptors kept.
  std::optional<v1::KeptManifest> ConsistentManifest() const;

  int fd_ = -1;
  int stop_pipe_[2] = {-1, -1};
  std::string path_;
  size_t max_fds_;
  mutable std::mutex mutex_;
  std::vector<std::string> notifications_;
  std::vector<std::pair<std::string, int>> stored_;  // in the order stored, as systemd passes them
  uint64_t settle_sent_ = 0;    // markers Settle sent through the socket
  uint64_t settle_taken_ = 0;   // the highest the reader has taken
  std::condition_variable taken_;
  std::thread reader_;
};

}  // namespace warmpool::launch
