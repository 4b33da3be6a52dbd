#include "supervisor/peer_limits.h"

#include <algorithm>
#include <functional>

#include "common/units.h"

namespace warmpool::supervisor {

std::string PeerKey::Describe() const {
  return tcp ? "TCP " + address : "uid " + std::to_string(uid);
}

size_t PeerKeyHash::operator()(const PeerKey& k) const {
  return k.tcp ? std::hash<std::string>()(k.address) ^ 0x9e3779b97f4a7c15ull : std::hash<uint64_t>()(k.uid);
}

ConnectionVerdict PeerAccounting::AdmitConnection(const PeerKey& peer, bool out_of_descriptors) {
  Usage& u = peers_[peer];
  ConnectionVerdict v;
  if (!out_of_descriptors && u.connections < shares_.connections_per_peer &&
      connections_ < shares_.connections) {
    u.connections++;
    connections_++;
    return v;
  }
  if (out_of_descriptors) {
    v.reason = metrics::Refusal::kOutOfDescriptors;
    v.why = Error(Code::kResourceExhausted,
                  "warmpoold is out of file descriptors: retry later; the operator should raise "
                  "its limit (LimitNOFILE=) or lower [limits] max_connections or "
                  "max_connections_per_peer");
  } else if (connections_ >= shares_.connections) {
    v.reason = metrics::Refusal::kConnections;
    v.why = Error(Code::kResourceExhausted,
                  "too many connections ({}, [limits] max_connections): retry later; the operator "
                  "may raise max_connections",
                  connections_);
  } else {
    v.reason = metrics::Refusal::kPeerConnections;
    v.why = Error(Code::kResourceExhausted,
                  "{} already has {} connections open, its share of the daemon ([limits] "
                  "max_connections_per_peer): close idle ones or wait for replies; the operator may "
                  "raise the share",
                  peer.Describe(), u.connections);
  }
  // The reserve is for the others too: one peer holds at most half of it.
  const uint32_t peer_reserve = std::max<uint32_t>(1, shares_.reserve_connections / 2);
  if (reserve_ < shares_.reserve_connections && u.reserve < peer_reserve) {
    u.reserve++;
    reserve_++;
    v.admission = Admission::kReserve;
    return v;
  }
  v.admission = Admission::kRefuse;
  v.reason = metrics::Refusal::kReserveFull;
  Forget(peer);
  return v;
}

void PeerAccounting::ConnectionClosed(const PeerKey& peer, Admission admission) {
  auto it = peers_.find(peer);
  if (it == peers_.end() || admission == Admission::kRefuse) return;
  Usage& u = it->second;
  if (admission == Admission::kServe && u.connections > 0) {
    u.connections--;
    connections_--;
  } else if (admission == Admission::kReserve && u.reserve > 0) {
    u.reserve--;
    reserve_--;
  }
  Forget(peer);
}

PeerAccounting::RequestVerdict PeerAccounting::AdmitRequest(const PeerKey& peer, uint64_t bytes) {
  Usage& u = peers_[peer];
  RequestVerdict v;
  if (u.requests >= shares_.requests_per_peer) {
    v.ok = false;
    v.reason = metrics::Refusal::kPeerRequests;
    v.why = Error(Code::kResourceExhausted,
                  "{} already has {} requests unanswered, its share of the daemon ([limits] "
                  "max_requests_per_peer): wait for replies before sending more",
                  peer.Describe(), u.requests);
  } else if (u.request_bytes + bytes > shares_.request_bytes_per_peer && u.requests > 0) {
    // A request alone is never refused for its size here: the frame limit bounds it.
    v.ok = false;
    v.reason = metrics::Refusal::kPeerRequestBytes;
    v.why = Error(Code::kResourceExhausted,
                  "{} already has {} of requests in the daemon, its share ([limits] "
                  "max_queued_bytes_per_peer {}): wait for replies before sending more",
                  peer.Describe(), FormatBytes(u.request_bytes),
                  FormatBytes(shares_.request_bytes_per_peer));
  }
  if (!v.ok) {
    Forget(peer);
    return v;
  }
  u.requests++;
  u.request_bytes += bytes;
  return v;
}

void PeerAccounting::RequestAnswered(const PeerKey& peer, uint64_t bytes) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  Usage& u = it->second;
  if (u.requests > 0) u.requests--;
  u.request_bytes -= std::min(u.request_bytes, bytes);
  Forget(peer);
}

void PeerAccounting::Forget(const PeerKey& peer) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return;
  const Usage& u = it->second;
  if (u.connections == 0 && u.reserve == 0 && u.requests == 0 && u.request_bytes == 0) peers_.erase(it);
}

PeerAccounting::Usage PeerAccounting::usage(const PeerKey& peer) const {
  auto it = peers_.find(peer);
  return it == peers_.end() ? Usage{} : it->second;
}

std::vector<PeerAccounting::CutOff> PeerAccounting::OverUnread(std::vector<Unread> sessions) const {
  std::vector<CutOff> out;
  // Largest first: cutting off the biggest holder frees the most with the fewest clients lost.
  std::sort(sessions.begin(), sessions.end(),
            [](const Unread& a, const Unread& b) { return a.bytes > b.bytes; });
  std::unordered_map<PeerKey, uint64_t, PeerKeyHash> per_peer;
  uint64_t total = 0;
  for (const Unread& s : sessions) {
    per_peer[s.peer] += s.bytes;
    total += s.bytes;
  }
  std::vector<bool> cut(sessions.size(), false);
  for (size_t i = 0; i < sessions.size(); i++) {
    uint64_t& mine = per_peer[sessions[i].peer];
    if (mine <= shares_.unread_bytes_per_peer || sessions[i].bytes == 0) continue;
    out.push_back({sessions[i].session,
                   Error(Code::kResourceExhausted,
                         "{} leaves {} of replies unread over its connections, past its share "
                         "([limits] max_unread_reply_bytes_per_peer {}): this connection, which "
                         "holds the most, is cut off; read replies before sending more",
                         sessions[i].peer.Describe(), FormatBytes(mine),
                         FormatBytes(shares_.unread_bytes_per_peer))});
    cut[i] = true;
    mine -= sessions[i].bytes;
    total -= sessions[i].bytes;
  }
  for (size_t i = 0; i < sessions.size() && total > shares_.unread_bytes; i++) {
    if (cut[i] || sessions[i].bytes == 0) continue;
    out.push_back({sessions[i].session,
                   Error(Code::kResourceExhausted,
                         "this client leaves {} of replies unread while the daemon holds {} for "
                         "all clients: disconnected",
                         FormatBytes(sessions[i].bytes), FormatBytes(total))});
    total -= sessions[i].bytes;
  }
  return out;
}

}  // namespace warmpool::supervisor
