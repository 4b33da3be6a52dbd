#include "supervisor/access.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace warmpool::supervisor {

bool Access::IsAdmin(const Peer& peer) const {
  if (peer.tcp) return peer.admin_token;  // no credentials over TCP: only the token
  if (peer.uid == 0 || peer.uid == geteuid()) return true;
  if (!admin_gid_) return false;
  if (peer.gid == *admin_gid_) return true;
  passwd pw{};
  passwd* found = nullptr;
  char buffer[4096];
  if (getpwuid_r(peer.uid, &pw, buffer, sizeof(buffer), &found) != 0 || found == nullptr) return false;
  int count = 64;
  std::vector<gid_t> groups(count);
  if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) {
    groups.resize(count);
    if (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &count) < 0) return false;
  }
  groups.resize(count);
  return std::find(groups.begin(), groups.end(), *admin_gid_) != groups.end();
}

}  // namespace warmpool::supervisor
