// Where `warmpool top` gets its samples. It asks the daemon once, over the socket, for its status
// (version, backend, and the instance that names the segment), then reads the segment read-only:
// watching costs the daemon nothing. A user the segment is closed to (it is 0600, or 0640 to
// [access] observer_group) gets the daemon's status and ps replies at each sample instead.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "client/client.h"
#include "top/top_sample.h"
#include "common/status.h"
#include "shm/segment.h"

namespace warmpool::top {

struct DaemonInfo {
  std::string socket;
  std::string version;
  std::string backend;
  std::string instance;
  // Empty when the segment is read; otherwise why it is not (shown in the header).
  std::string socket_reason;
  int64_t pid = 0;  // from the segment; 0 when only the socket is used
};

class PoolSource {
 public:
  // UNAVAILABLE naming the socket and what to do when no daemon answers there.
  static Result<std::unique_ptr<PoolSource>> Connect(const std::string& socket);
  ~PoolSource();
  PoolSource(const PoolSource&) = delete;
  PoolSource& operator=(const PoolSource&) = delete;

  // UNAVAILABLE once the daemon is gone (it exited, or stopped answering).
  Result<PoolSample> Sample();
  const DaemonInfo& daemon() const { return daemon_; }
  // Becomes readable when the daemon exits (a pidfd), so a wait can end at once; -1 when there
  // is none (socket only: a failed reply says it instead).
  int exit_fd() const { return pidfd_; }

 private:
  PoolSource() = default;
  // Maps the segment and watches its supervisor; the reason when that cannot be done.
  std::optional<std::string> UseSegment();
  bool SupervisorExited() const;

  DaemonInfo daemon_;
  std::unique_ptr<client::Client> client_;  // kept only without the segment
  std::optional<shm::SharedSegment> segment_;
  uint64_t start_ticks_ = 0;
  int pidfd_ = -1;
};

}  // namespace warmpool::top
