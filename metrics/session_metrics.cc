#include "metrics/session_metrics.h"

#include <fmt/format.h>

namespace warmpool::metrics {

const char* RefusalName(Refusal r) {
  switch (r) {
    case Refusal::kConnections: return "connections";
    case Refusal::kPeerConnections: return "peer_connections";
    case Refusal::kReserveFull: return "reserve_full";
    case Refusal::kOutOfDescriptors: return "out_of_descriptors";
    case Refusal::kRequestsPerConnection: return "requests_per_connection";
    case Refusal::kPeerRequests: return "peer_requests";
    case Refusal::kPeerRequestBytes: return "peer_request_bytes";
    case Refusal::kDuplicateRequestId: return "duplicate_request_id";
    case Refusal::kMalformedFrame: return "malformed_frame";
    case Refusal::kHttpUnreadable: return "http_unreadable";
    case Refusal::kHttpInvalid: return "http_invalid";
    case Refusal::kHttpUnauthenticated: return "http_unauthenticated";
    case Refusal::kSlowRequest: return "slow_request";
    case Refusal::kUnreadCutOff: return "unread_cut_off";
    case Refusal::kCount: break;
  }
  return "unknown";
}

void SessionCounters::Reply(Protocol protocol, Code code) {
  size_t c = static_cast<size_t>(code);
  if (c >= replies[0].size()) c = static_cast<size_t>(Code::kInternal);
  replies[static_cast<size_t>(protocol)][c]++;
}

std::string RenderSessionMetrics(const SessionCounters& counters) {
  std::string out;
  auto it = std::back_inserter(out);
  fmt::format_to(it,
                 "# HELP warmpool_replies_total Replies to client requests, by protocol and code, "
                 "including refusals made before the core\n"
                 "# TYPE warmpool_replies_total counter\n");
  constexpr const char* kProtocols[] = {"framed", "http"};
  for (size_t p = 0; p < 2; p++) {
    for (size_t c = 0; c < counters.replies[p].size(); c++) {
      fmt::format_to(it, "warmpool_replies_total{{protocol=\"{}\",code=\"{}\"}} {}\n", kProtocols[p],
                     CodeName(static_cast<Code>(c)), counters.replies[p][c]);
    }
  }
  fmt::format_to(it,
                 "# HELP warmpool_session_refusals_total Connections and requests refused by the "
                 "client socket before they reached the core, by reason\n"
                 "# TYPE warmpool_session_refusals_total counter\n");
  for (size_t r = 0; r < counters.refusals.size(); r++) {
    fmt::format_to(it, "warmpool_session_refusals_total{{reason=\"{}\"}} {}\n",
                   RefusalName(static_cast<Refusal>(r)), counters.refusals[r]);
  }
  fmt::format_to(it,
                 "# HELP warmpool_client_connections Client connections open, served or in the "
                 "reserve (metrics scrapes and typed refusals past a share)\n"
                 "# TYPE warmpool_client_connections gauge\n"
                 "warmpool_client_connections{{kind=\"served\"}} {}\n"
                 "warmpool_client_connections{{kind=\"reserve\"}} {}\n"
                 "# HELP warmpool_client_peers Peers (users, TCP addresses) with connections or "
                 "requests open\n"
                 "# TYPE warmpool_client_peers gauge\n"
                 "warmpool_client_peers {}\n",
                 counters.connections, counters.reserve_connections, counters.peers);
  return out;
}

}  // namespace warmpool::metrics
