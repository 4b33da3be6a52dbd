// warmpool-bench --abuse: what abusive clients cost the daemon's memory. A private warmpoold
// serves the echo engine; G greedy clients each pipeline requests of P MiB as fast as the socket
// takes them for S seconds and never read a reply, then vanish; a polite client meanwhile sends
// small requests one at a time. The daemon's resident set (VmRSS) is sampled every 10 ms. The
// same abuse runs twice in one run, against a daemon with the default limits ([limits]
// max_queued_bytes, max_queued_bytes_per_connection, max_unread_reply_bytes) and against one whose
// limits are raised out of the way (the daemon as it was before it had them): the report gives
// idle, peak and after-the-clients-left RSS of both, their ratio, and what the polite client saw.
// Like the other modes it asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct AbuseOptions {
  std::string daemon;            // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";
  uint32_t greedy = 4;           // G: greedy clients
  uint32_t payload_mib = 4;      // P: MiB of each of their requests
  uint32_t seconds = 5;          // S: how long they push
  bool json = false;
};

int RunAbuse(const AbuseOptions& options);

}  // namespace warmpool::bench
