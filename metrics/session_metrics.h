// What the client socket answers, counted where it answers: every reply to a request on either
// protocol, by its code, and every refusal the session layer makes before a request reaches the
// core (over a share or a limit, a request that cannot be read, a duplicate request id, a client
// too slow to send one). The segment's per-model series count what the core answered for
// registered models; these count the rest too, so that a refusal is never invisible.
//
// Kept in the daemon's memory (not the segment): only `GET /metrics` reads them, after the
// segment's series.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace warmpool::metrics {

enum class Protocol { kFramed, kHttp };

enum class Refusal {
  kConnections,           // past max_connections (answered from the reserve)
  kPeerConnections,       // past the peer's share of connections (answered from the reserve)
  kReserveFull,           // past both and past the reserve: refused at once
  kOutOfDescriptors,      // EMFILE/ENFILE
  kRequestsPerConnection, // max_requests_per_connection
  kPeerRequests,          // max_requests_per_peer
  kPeerRequestBytes,      // max_queued_bytes_per_peer
  kDuplicateRequestId,    // a framed request reusing the id of one not answered yet
  kMalformedFrame,        // not an Envelope, or over max_frame_bytes
  kHttpUnreadable,        // HTTP bytes the parser refused (bad syntax, over a limit)
  kHttpInvalid,           // an HTTP request refused before the daemon (parameter, body, path)
  kHttpUnauthenticated,   // an HTTP request over TCP without a valid API key ([http] api_keys_file)
  kSlowRequest,           // a request not complete request_read_timeout after its first byte
  kUnreadCutOff,          // cut off for replies left unread
  kCount,
};
const char* RefusalName(Refusal r);

struct SessionCounters {
  std::array<std::array<uint64_t, 9>, 2> replies{};  // [protocol][code]
  std::array<uint64_t, static_cast<size_t>(Refusal::kCount)> refusals{};
  // Gauges, set by the owner before rendering.
  uint64_t connections = 0;
  uint64_t reserve_connections = 0;
  uint64_t peers = 0;

  void Reply(Protocol protocol, Code code);
  void Refused(Refusal reason) { refusals[static_cast<size_t>(reason)]++; }
  uint64_t refused(Refusal reason) const { return refusals[static_cast<size_t>(reason)]; }
};

// Prometheus text (0.0.4) for the counters, to follow RenderPrometheus's.
std::string RenderSessionMetrics(const SessionCounters& counters);

}  // namespace warmpool::metrics
