// Warm models across a restart of warmpoold: the handles of resident weights and parked copies live
// on in the service manager's file-descriptor store (sd_pid_notify_with_fds(3), FDSTORE=1), and
// come back to the next warmpoold through LISTEN_FDS/LISTEN_FDNAMES, whose core adopts those that
// still match its registry (supervisor/core/adoption.cc). A crash, `systemctl restart` or an
// upgrade then reloads nothing.
//
// What is stored: one descriptor per kept handle, named
//   wp.<w|p>.<model>.<file version>.<pid>-<n>     (w: weights on the device, p: a parked copy)
// and a manifest, "wp.manifest.<sequence>": a sealed memfd holding v1::KeptManifest (what each
// handle is, which file version it came from, a fingerprint of its bytes, the LRU order). The
// store changes in an order that a crash at any point leaves consistent: new handles are stored
// before the manifest that names them, a new manifest before the old one goes, and before a
// handle's memory can be reused for anything else it leaves the store and a manifest without it
// is stored (Forget). Should the service manager not have taken those last messages when the
// daemon died, the fingerprint still tells memory reused since from the weights described. A
// manifest naming a descriptor the store lacks costs only that model's warmth.
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
#include "ipc/warm_store.pb.h"
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
  // manifest's models with their handles, least recently used first, each checked to be a memfd
  // holding at least the bytes it describes, with the fingerprint recorded (device_memfds false:
  // weights on a device may be another kind of descriptor, cuda's). What is not returned is closed
  // here, with a log line. Every name received stays in the store until a Sync lets it go.
  std::vector<KeptWeights> Receive(std::vector<PassedDescriptor>& passed, bool device_memfds = true);
  // Makes the store hold exactly `kept` (action::StoreKept, sent as often as the core decides):
  // leftovers of the start removed, new handles stored, then a manifest when what it would say
  // changed, then what is no longer kept removed.
  void Sync(const std::vector<KeptWeights>& kept);
  // A handle about to be closed (or its memory reused): out of the store, and out of the manifest,
  // now.
  void Forget(int fd);

  // A model whose header is larger is not kept (the manifest carries every header).
  static constexpr size_t kMaxKeptHeaderBytes = 256 * 1024;

 private:
  struct Stored {
    std::string name;
    uint64_t fingerprint = 0;
  };
  bool Store(int fd, const std::string& name);
  void Remove(const std::string& name);
  // Stores `manifest` under a new sequence and removes the one it replaces.
  void WriteNewManifest(v1::KeptManifest manifest);

  std::string instance_;
  bool enabled_ = false;
  bool refused_logged_ = false;
  uint64_t sequence_ = 0;
  uint64_t next_name_ = 0;
  std::string manifest_name_;    // in the store now ("" when none)
  v1::KeptManifest manifest_;    // what it says
  std::map<int, Stored> stored_;  // handle (held by the core) -> its entry in the store
  std::set<std::string> received_;  // names passed at start not (yet) accounted for
};

// wp.<w|p>.<model>.<version>.<unique>
std::string KeptName(const KeptWeights& kept, const std::string& unique);
// Of a memfd's bytes: 256 words spread over it, plus its first and last ones; 0 for a descriptor
// that is not a regular file (cuda device memory).
uint64_t RegionFingerprint(int fd);
// Kept at all: a handle, and a header the manifest can carry.
bool Keepable(const KeptWeights& kept);
// The manifest's record of one kept handle, stored under fd_name.
v1::KeptModel DescribeKept(const KeptWeights& kept, const std::string& fd_name, uint64_t fingerprint);
// A sealed memfd holding the manifest (the caller owns it).
Result<int> WriteManifest(const v1::KeptManifest& manifest);

}  // namespace warmpool::supervisor
