// One HTTP connection on the loop: a Unix socket that began with an HTTP method (ClientServer
// tells them from framed clients by their first bytes) or a loopback TCP connection. Requests
// become Envelopes handed to the daemon like any framed request (same access checks, limits and
// answers); replies come back through OnReply and are written in request order, as HTTP/1.1
// pipelining requires. Backpressure: at most kMaxPipelined requests are held per connection;
// past that the socket is not read until responses have gone out.
//
// Responses count against the client's unread bytes from the moment they are complete, not from
// when they are written: answers held in order behind a slow first request are memory the
// client makes the daemon keep, exactly like answers written and not read. The server's byte
// limits (per connection here; per peer and in all in ClientServer) see both.
//
// Lifetime: heap-allocated, owned by the loop. Close() (or the peer leaving) calls `closed` once;
// the object deletes itself when libuv has closed its handle.
#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include "common/status.h"
#include "http/request_parser.h"
#include "ipc/uv_handle.h"
#include "ipc/warmpool.pb.h"
#include "metrics/session_metrics.h"
#include "supervisor/http_access.h"
#include "supervisor/http_api.h"

namespace warmpool::supervisor {

class HttpSession {
 public:
  static constexpr size_t kMaxPipelined = 32;
  // Responses written and not yet taken by the client past which no more requests are read: a
  // client that pipelines without reading holds at most this much (plus one response).
  static constexpr uint64_t kMaxUnreadWhileReading = 1 << 20;
  static constexpr uint64_t kProgressPeriodMs = 250;
  // After an error response the rest of what the client sent is read and dropped this long, so
  // that closing with unread bytes does not reset the connection before the client reads it.
  static constexpr uint64_t kLingerMs = 2000;

  struct Hooks {
    // A request for the daemon. admin_token: it carried the configured admin token (TCP).
    std::function<void(v1::Envelope&& request, bool admin_token)> request;
    std::function<std::string()> metrics;
    std::function<void(const Status& why)> closed;
    // Every response written (its code), and every request refused here before the daemon.
    std::function<void(Code code)> answered;
    std::function<void(metrics::Refusal reason)> refused;
  };
  struct Options {
    http::ParserLimits limits;
    uint64_t max_unread_bytes = 128ull << 20;  // responses the client has not read: cut off past it
    bool tcp = false;
    // Who may call, from which pages (supervisor/http_access.h); shared by the server's sessions.
    std::shared_ptr<const HttpAccess> access = std::make_shared<const HttpAccess>();
    // Not ok: a connection from the reserve (supervisor/peer_limits.h). It may scrape /metrics;
    // any other request is answered with this. Either way it serves one request and closes.
    Status reserve_refusal;
    metrics::Refusal reserve_reason = metrics::Refusal::kPeerConnections;
  };

  // Unix socket: takes the connected descriptor.
  static HttpSession* OpenPipe(uv_loop_t* loop, int fd, Options options, Hooks hooks);
  // TCP: accepts the pending connection of `server`; nullptr if that failed.
  static HttpSession* AcceptTcp(uv_loop_t* loop, uv_stream_t* server, Options options, Hooks hooks);

  void OnReply(const v1::Envelope& reply);
  void Close(const Status& why);
  // Responses written and not taken by the client, and complete ones held behind an earlier one.
  uint64_t pending_write_bytes() const { return unread_bytes_ + held_bytes_; }
  uint64_t held_bytes() const { return held_bytes_; }
  // For the server's timeouts (uv_now): when bytes last came in; whether nothing is under way
  // (no request being read, none waiting, nothing unwritten); whether a request is half read.
  uint64_t last_read_ms() const { return last_read_ms_; }
  bool quiet() const { return exchanges_.empty() && unread_bytes_ == 0 && !parser_.mid_request(); }
  bool mid_request() const { return parser_.mid_request(); }
  // When the request being read began (its first byte taken by the parser); meaningful while
  // mid_request(). A client that trickles a request is timed from here, not from its last byte.
  // Time the daemon itself stopped reading (kMaxPipelined, bytes held) does not count.
  uint64_t request_started_ms() const { return request_started_ms_; }
  bool reading() const { return reading_; }
  // Ends the connection with one error response (`status`, 0: the code's) when nothing else is
  // owed, else at once. linger: read and drop what the client still sends for a while first, so
  // that it gets the response instead of a reset (a refusal that must not hold a descriptor
  // long does without).
  void EndWith(const Status& why, int status, bool linger);
  // TCP: the client's address without the port ("127.0.0.1"); "" when not known.
  std::string PeerAddress() const;
  // Makes a connection just accepted one of the reserve (Options::reserve_refusal).
  void SetReserve(const Status& refusal, metrics::Refusal reason) {
    options_.reserve_refusal = refusal;
    options_.reserve_reason = reason;
  }

 private:
  struct Exchange {
    httpapi::Plan plan;
    uint64_t request_id = 0;
    bool keep_alive = true;
    bool head_only = false;       // HEAD: the head of the response, no body
    std::string response;         // complete once `ready`
    bool ready = false;
    Code code = Code::kOk;        // of the response, for the metrics
    bool streaming = false;       // load, generate: the chunked head (and lines) went out
    bool http11 = true;           // chunked responses (load progress, generate) only for HTTP/1.1
    http::Headers cors;           // added to its response's head (http_access.h)
    // generate: NDJSON lines that came while an earlier exchange still owed its response; they
    // go out when this one reaches the head (HTTP/1.0: with the final line, as one body).
    std::string held_lines;
  };

  HttpSession(uv_loop_t* loop, Options options, Hooks hooks);
  ~HttpSession() = default;
  bool Start();
  void OnRead(ssize_t n, const uv_buf_t* buf);
  void Consume();
  void Handle(http::Request&& request);
  void Flush();  // writes the complete responses at the head, in order
  void Write(std::string bytes);
  void Progress();
  // A generate's chunk for exchange `e` (http_generate.h): written at once at the head, else held.
  void OnChunk(Exchange& e, const v1::GenerateChunk& chunk);
  // The response that ends a streamed generate: the lines held, then the final one.
  std::string EndStream(Exchange& e, const v1::Envelope& reply);
  // The head exchange's held lines go out (it just reached the head).
  void WriteHeldLines();
  // The exchange's response is complete: it counts as held until written.
  void MakeReady(Exchange& e, std::string response, Code code);
  bool RoomToRead() const;
  // Reads while there is room (kMaxPipelined, kMaxUnreadWhileReading); stops otherwise.
  void UpdateReading();
  // All answered and the connection is to end: closes once the writes are out (lingering first
  // after an error response).
  void CloseWhenWritten();
  void StartReading();
  uv_stream_t* stream() { return reinterpret_cast<uv_stream_t*>(&handle_); }

  uv_loop_t* loop_;
  Options options_;
  Hooks hooks_;
  union {
    uv_pipe_t pipe;
    uv_tcp_t tcp;
  } handle_{};
  ipc::UvHandle<uv_timer_t> progress_timer_;
  http::RequestParser parser_;
  std::string unparsed_;  // read, not yet taken by the parser (held while kMaxPipelined wait)
  std::deque<Exchange> exchanges_;
  std::unordered_set<uint64_t> progress_requests_;  // status requests of our own, not answered
  uint64_t next_request_id_ = 1;
  uint64_t unread_bytes_ = 0;
  uint64_t held_bytes_ = 0;  // complete responses not yet written (behind one that is not)
  uint64_t request_started_ms_ = 0;
  uint64_t paused_at_ms_ = 0;  // when UpdateReading last stopped reading
  bool reading_ = false;
  bool no_more_requests_ = false;  // EOF, an error, or Connection: close
  bool closed_ = false;
  bool consuming_ = false;
  bool linger_ = false;     // an error response ends the connection: drain before closing
  bool lingering_ = false;  // shut down for writing; what arrives is dropped until EOF
  uint64_t last_read_ms_ = 0;
  uv_shutdown_t shutdown_{};
  char buffer_[64 << 10];
};

}  // namespace warmpool::supervisor
