// The client socket: accepts connections, turns frames into Envelopes and hands them to the daemon,
// and sends replies back to the session that asked. A session that vanished simply stops receiving:
// replies to it are dropped, and nothing else is disturbed. Bad input (a frame over the limit, bytes
// that are not an Envelope) gets one error reply and the connection is closed. Each limit (frame
// size, connections, unanswered requests per connection, replies left unread) answers
// RESOURCE_EXHAUSTED or INVALID_ARGUMENT to the one client over it. Each peer (a local user, a
// TCP address) also has a share of connections, requests and bytes (supervisor/peer_limits.h),
// so that one user's abuse leaves room for everybody else; a connection past a share is served
// from a small reserve that still answers /metrics and tells anything else why.
//
// Descriptors (client_accept.cc): descriptors are kept open in reserve, one for each reserve
// connection, so that a connection past a share can be accepted and told why even when the
// daemon's descriptors are all in use. Out of file descriptors (EMFILE, ENFILE) and with the
// reserve spent, accepting stops instead of spinning: accepting resumes when a session closes or
// after a pause, and the log says so at most once a second. Connections idle longer than
// idle_timeout_ms (nothing outstanding) are closed, and a request (or the first bytes of a
// connection) not complete request_read_timeout_ms after its first byte ends its connection:
// trickling a byte now and then does not hold a connection.
//
// Every request handed to the daemon is answered exactly once through Send(): a session knows
// the ids it has outstanding, and a framed request that reuses one of them is refused
// (INVALID_ARGUMENT) rather than merged with it. Every reply and every refusal made here is
// counted (metrics/session_metrics.h) and shown after the segment's series in GET /metrics.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <uv.h>

#include "common/status.h"
#include "ipc/connection.h"
#include "ipc/uv_handle.h"
#include "ipc/warmpool.pb.h"
#include "metrics/session_metrics.h"
#include "supervisor/core/request_check.h"
#include "supervisor/http_session.h"
#include "supervisor/access.h"
#include "supervisor/peer_limits.h"

namespace warmpool::supervisor {

class ClientServer;

// Watching a connection's first bytes: readable, or (a method's first bytes only) again shortly.
struct SniffWatch {
  ClientServer* server = nullptr;
  uint64_t session = 0;
  ipc::UvHandle<uv_poll_t> poll;
  ipc::UvHandle<uv_timer_t> retry;
  bool polling = false;
};

class ClientServer {
 public:
  // fd: the descriptor a region request carried (the handler owns it), else -1.
  using RequestHandler =
      std::function<void(uint64_t session, const Peer& peer, v1::Envelope&& request, int fd)>;

  struct Options {
    uint32_t max_frame_bytes = 64u << 20;
    uint32_t max_connections = 1024;
    uint32_t max_requests_per_connection = 256;
    // Replies one client has not read, and all clients together: past the first the client is
    // cut off; past the second, the client with the most unread.
    uint64_t max_unread_reply_bytes = 128ull << 20;
    uint64_t max_unread_reply_bytes_total = 1ull << 30;
    // Each peer's share (supervisor/peer_limits.h); config.cc resolves the defaults.
    uint32_t max_connections_per_peer = 256;
    uint32_t max_requests_per_peer = 512;
    uint64_t max_queued_bytes_per_peer = 256ull << 20;
    uint64_t max_unread_reply_bytes_per_peer = 256ull << 20;
    uint32_t reserved_connections = 16;
    // From a request's first byte (a connection's, until it says what it speaks) to its last.
    uint64_t request_read_timeout_ms = 10'000;
    uint64_t idle_timeout_ms = 0;  // 0: never
    ipc::WriteBatcher* batcher = nullptr;  // replies coalesced per turn of the loop
    // HTTP (supervisor/http_session.h): the body of GET /metrics; the token that makes a TCP
    // request an admin's ("" none: over TCP only reads and infer).
    std::function<std::string()> metrics;
    std::string admin_token;
    // TCP: keys one of which every request must carry (empty: none asked); origins whose pages
    // may call the API (supervisor/http_access.h).
    std::vector<std::string> api_keys;
    std::vector<std::string> cors_origins;
  };
  using ClosedHandler = std::function<void(uint64_t session)>;
  // on_closed: a session that handed requests on is gone; nothing sent to it arrives.
  ClientServer(uv_loop_t* loop, const Options& options, RequestHandler on_request,
               ClosedHandler on_closed = nullptr);
  ~ClientServer();

  // Where the daemon serves, in order of precedence: the socket a takeover handed over
  // (`taken`, its file this daemon's), the one the service manager passed (`activated`), else a new
  // one at `path` (Listen); then HTTP on `http_listen` when it is set. -1: none.
  Status Open(int taken, int activated, const std::string& path, std::optional<gid_t> group,
              const std::string& http_listen);
  // Binds path, removing a stale socket; refuses one that a live daemon answers on. The socket is
  // 0600, or 0660 owned by `group` when one is given.
  Status Listen(const std::string& path, std::optional<gid_t> group = std::nullopt);
  // Serves on a listening socket somebody else bound (systemd socket activation). Its file is
  // theirs: it is never unlinked here.
  // owns_path: the file is this daemon's after all (a socket handed over by `--takeover`): it is
  // unlinked at stop as one bound here.
  Status Adopt(int fd, bool owns_path = false);
  // The listening socket, for a daemon taking over (supervisor/takeover.h); -1 when not listening.
  int HandOverListener() const { return listen_fd_; }
  // Once it is handed over: the socket's file is the other daemon's, never unlinked here.
  void ReleasePath() { owns_path_ = false; }
  // The HTTP API on a loopback TCP address ("127.0.0.1:8080", "[::1]:8080"); any other address
  // is refused: the API has no TLS, and reads need no credentials.
  Status ListenTcp(const std::string& address);
  // Stops accepting new connections; sessions stay open for the replies they wait for.
  void StopAccepting();
  // StopAccepting, and closes every session (flushing what the kernel takes).
  void Close();
  // [http] api_keys_file and admin_token_file read again (SIGHUP; the paths as the configuration
  // names them now), as supervisor/http_access.h's ReloadApiKeys and ReloadAdminToken decide, and
  // logged: what they read serves from now on, for connections already open too (their next
  // request is judged by it).
  void ReloadSecrets(const std::string& api_keys_file, const std::string& admin_token_file);

  // Dropped when the session is gone.
  void Send(uint64_t session, const v1::Envelope& reply);
  bool HasSession(uint64_t session) const { return sessions_.count(session) != 0; }
  size_t session_count() const { return sessions_.size(); }
  const metrics::SessionCounters& counters() const { return counters_; }
  const std::string& path() const { return path_; }

 private:
  struct Session;
  void StartPolling(int fd);
  void OnAcceptable();
  // EMFILE/ENFILE: accept into the reserve with the descriptors kept for it; else pause.
  void OnOutOfDescriptors(int err);
  // A connection accepted on the Unix socket: served, in the reserve, or refused at once.
  void Admit(int fd, const Peer& peer, bool out_of_descriptors);
  // Keeps one descriptor open for each reserve place not in use.
  void RefillReserve();
  void LogRefusals(const char* what);
  void PauseAccepting(uint64_t ms);
  void ResumeAccepting();
  void CloseIdle();
  // Cuts off connections for replies left unread: past a peer's share, past the total.
  void CheckUnread();
  void OnFrame(uint64_t session, std::string_view body);
  // A request from either protocol, past its own parsing: its id, the per-connection and
  // per-peer bounds, then the daemon.
  void Accept(uint64_t session, v1::Envelope&& request, int fd, bool admin_token);
  // Answers a request here, never handing it on, and counts why.
  void Refuse(Session& s, uint64_t request_id, metrics::Refusal reason, const Status& why);
  // Writes a framed reply and counts it: every framed reply goes through here.
  void SendFramed(Session& s, const v1::Envelope& reply);
  // A Unix connection's first bytes: framed protocol or HTTP (http::SniffFirstBytes).
  void Classify(uint64_t session);
  void OpenFramed(uint64_t session, int fd);
  void OpenHttp(uint64_t session, int fd);
  // What an HTTP session gets on either listener (the admin token only over TCP), and its hooks.
  HttpSession::Options HttpOptions(bool tcp, const Status& reserve_refusal) const;
  HttpSession::Hooks HttpHooks(uint64_t session);
  void OnTcpConnection(int status);
  // Erases a session that is gone and gives back what it held of its peer's share.
  void Forget(uint64_t session);
  // A session past request_read_timeout (or a reserve one past kReserveTimeoutMs).
  void TimeOutSession(uint64_t session);
  void OnSessionClosed(uint64_t session, const Status& why);
  void CloseSlowStarters();
  http::ParserLimits HttpLimits() const;

  uv_loop_t* loop_;
  Options options_;
  // Every HTTP session's (supervisor/http_access.h), which read it at each request: on the loop's
  // thread, as SetApiKeys changes it.
  std::shared_ptr<HttpAccess> http_access_;
  RequestHandler on_request_;
  ClosedHandler on_closed_;
  int listen_fd_ = -1;
  std::string path_;
  bool owns_path_ = false;  // false for an activated socket
  ipc::UvHandle<uv_poll_t> listen_poll_;
  bool accepting_ = false;
  ipc::UvHandle<uv_timer_t> resume_timer_;
  ipc::UvHandle<uv_timer_t> idle_timer_;
  uint64_t refused_since_log_ = 0;  // connections refused at once since the last log line
  uint64_t last_refusal_log_ms_ = 0;
  uint64_t next_session_ = 1;
  struct Session {
    ipc::Connection* connection = nullptr;  // framed protocol
    HttpSession* http = nullptr;            // HTTP
    // Neither yet: waiting for the first bytes (at most request_read_timeout_ms).
    int sniff_fd = -1;
    std::unique_ptr<SniffWatch> sniff;
    Peer peer;
    PeerKey key;
    Admission admission = Admission::kServe;
    Status refusal;  // in the reserve: what a request other than a scrape is told
    metrics::Refusal reserve_reason = metrics::Refusal::kPeerConnections;
    bool close_counted = false;  // why it is closing is counted already
    // Handed to the daemon, not yet answered: request id -> bytes counted against the peer.
    std::unordered_map<uint64_t, uint64_t> outstanding;
    uint64_t accepted_ms = 0;
    // While its protocol is not known yet: when its first byte was seen waiting (0: none yet). A
    // connection that has sent nothing is idle, not slow: only idle_timeout closes it.
    uint64_t first_byte_ms = 0;
    uint64_t last_active_ms = 0;
    uint64_t Unread() const;
    void Close(const Status& why);
  };
  // A connection from the reserve must have asked within this (it serves one request); an HTTP
  // connection with nothing under way is closed after kHttpKeepAliveMs.
  static constexpr uint64_t kReserveTimeoutMs = 2'000;
  static constexpr uint64_t kHttpKeepAliveMs = 60'000;
  // A session holding this much unread makes the server look at every peer's share.
  static constexpr uint64_t kUnreadCheckBytes = 256u << 10;
  PeerAccounting accounting_;
  metrics::SessionCounters counters_;
  std::vector<int> reserve_fds_;  // one per reserve place not in use
  ipc::UvHandle<uv_tcp_t> tcp_listener_;
  bool tcp_listening_ = false;
  ipc::UvHandle<uv_timer_t> sniff_timer_;
  std::unordered_map<uint64_t, Session> sessions_;
};

}  // namespace warmpool::supervisor
