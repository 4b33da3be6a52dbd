// Fair shares of the client socket. Limits that are only global let the first client that
// pushes take everybody's share: one user's idle connections (or every descriptor the daemon
// has) lock all other users out, one user's unread replies use up the byte bound of all. So
// every peer gets a share of its own, and the global limits still bound the sum:
//
//   connections            per peer, and in all (max_connections)
//   requests               handed to the daemon and not answered yet, per peer (the core bounds
//                          them in all: [pool] max_queue, max_inflight)
//   request bytes          of those requests, per peer (the core: per connection and in all)
//   unread reply bytes     replies written or held for a client that has not read them, per peer
//                          and in all; past either the connection with the most is cut off
//
// A peer is a local user (the uid the kernel gives with a Unix connection) or a TCP source
// address. The TCP listener serves loopback only, where every client is 127.0.0.1 (or ::1): all
// TCP clients share one share. That is on purpose: a proxy in front of the daemon is one peer,
// a local user who wants a share of their own has the Unix socket, and TCP clients, which need
// no credentials, can never take more than one user's share.
//
// A connection past its peer's share (or past max_connections) is still accepted, into a small
// reserve: a reserve connection may scrape /metrics, and any other request gets
// RESOURCE_EXHAUSTED saying what to do, after the request was read (a client whose request is
// not read before the daemon closes sees a broken pipe, not the reason). One peer may hold at
// most half of the reserve, so scrapes and refusals for the others always find room. Past the
// reserve the connection is refused at once (still with a typed error, best effort).
//
// Only decisions live here, no sockets and no clock: ClientServer carries them out.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "metrics/session_metrics.h"

namespace warmpool::supervisor {

struct PeerKey {
  bool tcp = false;
  uid_t uid = 0;        // Unix socket
  std::string address;  // TCP: the source address, without the port
  bool operator==(const PeerKey&) const = default;
  // "uid 1000", "TCP 127.0.0.1": for messages that tell a client whose share is full.
  std::string Describe() const;
};

struct PeerKeyHash {
  size_t operator()(const PeerKey& k) const;
};

struct PeerShares {
  uint32_t connections = 1024;
  uint32_t connections_per_peer = 256;
  uint32_t reserve_connections = 16;
  uint32_t requests_per_peer = 512;
  uint64_t request_bytes_per_peer = 256ull << 20;
  uint64_t unread_bytes = 1ull << 30;
  uint64_t unread_bytes_per_peer = 256ull << 20;
};


enum class Admission { kServe, kReserve, kRefuse };

struct ConnectionVerdict {
  Admission admission = Admission::kServe;
  metrics::Refusal reason = metrics::Refusal::kConnections;  // unless kServe: the metrics label
  Status why;                                         // unless kServe: what the client is told
};

class PeerAccounting {
 public:
  explicit PeerAccounting(const PeerShares& shares) : shares_(shares) {}

  // Counts the connection in (kServe, kReserve) or not (kRefuse); ConnectionClosed gives it back.
  // out_of_descriptors: the connection came in on a reserve descriptor (the daemon has no other
  // left): the reserve or nothing.
  ConnectionVerdict AdmitConnection(const PeerKey& peer, bool out_of_descriptors = false);
  void ConnectionClosed(const PeerKey& peer, Admission admission);

  struct RequestVerdict {
    bool ok = true;
    metrics::Refusal reason = metrics::Refusal::kPeerRequests;
    Status why;
  };
  // Counts the request in when it fits; RequestAnswered gives it back.
  RequestVerdict AdmitRequest(const PeerKey& peer, uint64_t bytes);
  void RequestAnswered(const PeerKey& peer, uint64_t bytes);

  // Which connections to cut off for replies left unread: while a peer is over its share, its
  // connection with the most; then, while all are over the total, the one with the most.
  struct Unread {
    uint64_t session = 0;
    PeerKey peer;
    uint64_t bytes = 0;
  };
  struct CutOff {
    uint64_t session = 0;
    Status why;
  };
  std::vector<CutOff> OverUnread(std::vector<Unread> sessions) const;

  struct Usage {
    uint32_t connections = 0;
    uint32_t reserve = 0;
    uint32_t requests = 0;
    uint64_t request_bytes = 0;
  };
  Usage usage(const PeerKey& peer) const;
  uint32_t connections() const { return connections_; }
  uint32_t reserve_in_use() const { return reserve_; }
  size_t peers() const { return peers_.size(); }
  const PeerShares& shares() const { return shares_; }

 private:
  void Forget(const PeerKey& peer);

  PeerShares shares_;
  uint32_t connections_ = 0;  // served, all peers
  uint32_t reserve_ = 0;      // in the reserve, all peers
  std::unordered_map<PeerKey, Usage, PeerKeyHash> peers_;
};

}  // namespace warmpool::supervisor
