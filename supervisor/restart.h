// What carries warm models from one warmpoold to the next, on the way in and on the way out:
//   in:  the service manager's descriptor store (supervisor/warm_store.h) and, with --takeover,
//        what the running daemon hands over (supervisor/takeover.h);
//   out: the store kept as the core decides (action::StoreKept), and the hand-over to a daemon
//        that takes over (Daemon::OnTakeover, whose checks are CheckTakeover).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"
#include "supervisor/core/kept.h"
#include "supervisor/service_manager.h"
#include "supervisor/warm_store.h"

namespace warmpool::supervisor {

class Restart {
 public:
  // `notifying`: started by a service manager that takes readiness (and keeps a store).
  Restart(const Config& config, bool notifying);

  struct Received {
    std::vector<KeptWeights> kept;  // for Core::Start, least recently used first
    int taken_socket = -1;          // --takeover: the listening socket handed over
  };
  // At start, after the backend is known: what the service manager passed (`passed`: what is
  // not the store's stays there) and, with --takeover, what the running daemon hands over.
  // `activated`: the service manager passed a listening socket. Late in the start, so that what
  // can fail on its own fails before a running daemon stops serving.
  Result<Received> Receive(std::vector<PassedDescriptor>& passed, bool activated);

  // action::StoreKept.
  void Store(const std::vector<KeptWeights>& kept) { store_->Sync(kept); }
  // A handle the core lets go of: out of the store before its memory can hold anything else
  // (whether it may be reused here is the core's to say: core/kept_memory.h).
  void Forget(int fd) { store_->Forget(fd); }

  // Running daemon, once CheckTakeover said yes: hands `listener` and `kept` (Core::Kept) over on
  // `channel` (the new daemon's end, closed here). `before_end` runs before the last message (the
  // segment's name let go: the new daemon creates its own under it). Returns whether this daemon
  // stops now: true when the new one has everything, or failed after before_end ran (logged);
  // false when nothing was handed over (`failed` says why; this one goes on serving).
  bool HandOverTo(int channel, int listener, const std::vector<KeptWeights>& kept,
                  const std::function<void()>& before_end, Status* failed);
  bool handed_over() const { return handed_over_; }

 private:
  const Config& config_;
  bool notifying_;
  std::unique_ptr<WarmStore> store_;
  bool handed_over_ = false;
};

}  // namespace warmpool::supervisor
