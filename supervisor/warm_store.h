// Warm models across a restart of warmpoold: the handles of resident weights and parked copies live
// on in the service manager's file-descriptor store (sd_pid_notify_with_fds(3), FDSTORE=1), and
// come back to the next warmpoold through LISTEN_FDS/LISTEN_FDNAMES, whose core adopts those that
// still match its registry (supervisor/core/adoption.cc). A crash, `systemctl restart` or an
// upgrade then reloads nothing.
//
// What is stored: one descriptor per kept handle, named
//   wp.<w|p>.<model>.<file version>.<inode>     (w: weights on the device, p: a parked copy)
// and a manifest, "wp.manifest.<sequence>": a sealed memfd holding v1::KeptManifest (what each
// handle is, which file version it came from, the LRU order). The store changes in an order that a
// crash at any point leaves consistent: new handles are stored before the manifest that names
// them, a new manifest before the old one goes, and a handle goes from the store before its memory
// can be reused for anything else (Forget). A manifest naming a descriptor the store lacks costs
// only that model's warmth.
//
// The store needs FileDescriptorStoreMax= in the unit (systemd/warmpool.service.in); without it
// systemd refuses the descriptors and models load again after a restart, as before.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/warmpool.pb.h"
#include "supervisor/core/kept.h"

namespace warmpool::supervisor {

// A descriptor the service manager passed at start, with its name (LISTEN_FDNAMES).
struct PassedDescriptor {
  int fd = -1;
  std::string name;
};
// Everything passed at start (LISTEN_FDS), taken from the environment; empty when nothing was.
Result<std::vector<PassedDescriptor>> PassedDescriptors();
// The listening socket among them (socket activation), -1 when none; an error when more than one
// was passed (warmpool.socket has one ListenStream=). Descriptors that are neither a socket nor
// named "wp." are closed with a warning.
Result<int> ActivatedSocket(std::vector<PassedDescriptor>& passed);

class WarmStore {
 public:
  // enabled: a service manager listens (NOTIFY_SOCKET) and keeps descriptors ($FDSTORE is not 0).
  WarmStore(std::string instance, bool enabled);
  ~WarmStore();
  WarmStore(const WarmStore&) = delete;
  WarmStore& operator=(const WarmStore&) = delete;

  bool enabled() const { return enabled_; }
  // Takes the "wp." descriptors among those passed (the rest stay in `passed`): the newest
  // manifest's models with their handles, each checked to be a memfd holding at least the bytes it
  // describes, least recently used first. What is not returned is closed here, with a log line.
  // Every name received stays in the store until a Sync lets it go.
  std::vector<KeptWeights> Receive(std::vector<PassedDescriptor>& passed);
  // Makes the store hold exactly `kept` (Core::Kept): new handles, then a manifest when what it
  // would say changed, then removals.
  void Sync(const std::vector<KeptWeights>& kept);
  // A handle about to be closed (or its memory reused): out of the store now.
  void Forget(int fd);

 private:
  bool Store(int fd, const std::string& name);
  void Remove(const std::string& name);

  std::string instance_;
  bool enabled_ = false;
  bool refused_logged_ = false;
  uint64_t sequence_ = 0;
  std::string manifest_name_;   // in the store now ("" when none)
  std::string manifest_bytes_;  // what it says
  std::map<uint64_t, std::string> stored_;  // inode -> name, the handles in the store
  std::set<std::string> received_;          // names passed at start not (yet) accounted for
};

// wp.<w|p>.<model>.<version>.<inode>
std::string KeptName(const KeptWeights& kept, uint64_t inode);
// The manifest's record of one kept handle, stored under fd_name.
v1::KeptModel DescribeKept(const KeptWeights& kept, const std::string& fd_name);
// A sealed memfd holding the manifest (the caller owns it).
Result<int> WriteManifest(const v1::KeptManifest& manifest);

}  // namespace warmpool::supervisor
