// Who is on the other end of a session and what they may do. The kernel says who (SO_PEERCRED at
// accept time, supervisor/client_accept.cc); which requests need an admin is the core's table
// (IsAdminRequest, supervisor/core/request_check.h); who is an admin is decided here: root, the
// daemon's own user, a member of [access] admin_group, or over loopback TCP whoever sends
// [http] admin_token.
#pragma once

#include <sys/types.h>

#include <optional>

namespace warmpool::supervisor {

struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  bool tcp = false;          // the HTTP API on loopback TCP: no credentials (uid and gid are -1)
  bool admin_token = false;  // ... and this request carried [http] admin_token
};

class Access {
 public:
  explicit Access(std::optional<gid_t> admin_gid = std::nullopt) : admin_gid_(admin_gid) {}
  // Looks the peer's supplementary groups up when its primary group is not admin_group.
  bool IsAdmin(const Peer& peer) const;

 private:
  std::optional<gid_t> admin_gid_;
};

}  // namespace warmpool::supervisor
