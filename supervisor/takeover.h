// A zero-reload upgrade without a service manager: `warmpoold --takeover` asks the daemon serving
// its socket for everything that makes it warm, and serves in its place.
//
//   new daemon                                running daemon
//   connect to the socket; socketpair()
//   TakeoverRequest + one end (SCM_RIGHTS) ─▶ admin only; stops accepting (the listening socket
//                                             stays open for the new one), reuses no more memory
//                       ◀──── channel ─────── the listening socket, the manifest, each kept handle
//                                             (names and descriptors, SOCK_SEQPACKET), then "END"
//                                             after it unlinked its segment's name
//                       ◀──── TakeoverReply ─ then it drains: requests it accepted are answered,
//   adopts what matches (as after a restart     new ones on its old connections are refused
//   under systemd: supervisor/warm_store.h),    UNAVAILABLE ("reconnect and send it again"), its
//   creates the segment, serves the socket      sessions close, its workers stop, it exits
//
// Clients see at most a reconnect: a connection made after the handover is queued in the same
// listening socket and served by the new daemon; no request the old one accepted goes unanswered.
// Memory is shared, not copied: while the old daemon drains, both count the same weights against
// their budgets.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/core/kept.h"
#include "supervisor/warm_store.h"

namespace warmpool::supervisor {

// What a running daemon knows when a takeover is asked, and whether it hands over: the checks in
// order, each refusal a typed error the asking daemon prints (no socket is touched here).
struct TakeoverAsk {
  bool tcp = false;                // asked over the HTTP listener
  bool admin = false;              // root, the daemon's user or a member of [access] admin_group
  bool seqpacket_channel = false;  // the request carried one end of a SOCK_SEQPACKET socketpair
  bool stopping = false;           // this daemon is stopping, or handed over already
  bool under_service_manager = false;  // socket-activated or notifying systemd
  bool accepting = false;          // it still has its listening socket to hand over
};
Status CheckTakeover(const TakeoverAsk& ask);
// What TakeoverAsk::seqpacket_channel asks of the descriptor that came with the request (-1: none).
bool IsSeqpacketSocket(int fd);

// The name the listening socket travels under.
inline constexpr char kHandedSocketName[] = "listen";

// New daemon: takes over from the daemon serving socket_path. Returns the descriptors handed over
// as PassedDescriptors: the listening socket (kHandedSocketName) and the manifest and handles
// ("wp." names, for WarmStore::Receive).
Result<std::vector<PassedDescriptor>> TakeOver(const std::string& socket_path, int timeout_ms = 10000);

// Running daemon: sends what TakeOver receives over `channel` (the new daemon's end of its
// socketpair). `before_end` runs before the final message: what the new daemon may rely on once
// it has everything (the segment's name let go).
Status HandOver(int channel, int listen_fd, const std::vector<KeptWeights>& kept, const std::string& instance,
                const std::function<void()>& before_end);

}  // namespace warmpool::supervisor
