// One benchmark connection: a closed-loop round trip of one `infer` request on the echo model.
// Both targets do the same client-side work (build the Envelope the client library builds, frame
// it, write it, read and parse the reply, copy the tensor out), so that their difference is the
// path between client and echo.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/status.h"
#include "ipc/blocking_channel.h"

namespace warmpool::bench {

class Session {
 public:
  virtual ~Session() = default;
  // Sends one request and waits for its reply; checks that the payload came back whole.
  virtual Status RoundTrip() = 0;
  // Keeps `depth` requests in flight until `count` replies came back (checked as RoundTrip checks
  // them); appends each one's latency (ns). The same work on both targets, and none allocating
  // per request: one reused request, frame and reply.
  virtual Status Pipeline(uint64_t count, uint32_t depth, std::vector<uint64_t>& latencies) = 0;
};

// The Envelope that Client::Infer sends (request_id and protocol_version set as Client::Send does).
v1::Envelope MakeInferRequest(const std::string& model, const client::Matrix& input,
                              uint64_t request_id, bool first);

// Through warmpoold with the client library.
Result<std::unique_ptr<Session>> ConnectWarmpool(const std::string& socket_path,
                                                 const std::string& model,
                                                 const client::Matrix& input);
// Through the baseline relay; the reply is the request echoed back.
Result<std::unique_ptr<Session>> ConnectRelay(const std::string& socket_path,
                                              const std::string& model,
                                              const client::Matrix& input);

using Sessions = std::vector<std::unique_ptr<Session>>;

// Runs `total` round trips split over the sessions, one thread each, all released at once, each
// with `depth` requests in flight (1: closed loop); appends every latency (ns) to out and returns
// the wall time from release to the last reply.
Result<double> RunPhase(Sessions& sessions, uint64_t total, std::vector<uint64_t>* out, uint32_t depth = 1);

// A failsafe against a hung peer (not a measurement bound): a read waiting this long fails.
inline constexpr int kReceiveTimeoutSeconds = 60;
void SetReceiveTimeout(int fd);

}  // namespace warmpool::bench
