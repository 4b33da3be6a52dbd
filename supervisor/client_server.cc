// Sessions of the client socket: requests in, replies out, and the bounds on both. Listening is
// client_listen.cc, accepting client_accept.cc, the shares of each peer peer_limits.h.
#include "supervisor/client_server.h"

#include <sys/ioctl.h>

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <spdlog/spdlog.h>

#include "http/request_parser.h"
#include "ipc/descriptors.h"
#include "ipc/framing.h"

namespace warmpool::supervisor {

namespace {

PeerShares SharesOf(const ClientServer::Options& o) {
  PeerShares shares;
  shares.connections = o.max_connections;
  shares.connections_per_peer = o.max_connections_per_peer;
  shares.reserve_connections = o.reserved_connections;
  shares.requests_per_peer = o.max_requests_per_peer;
  shares.request_bytes_per_peer = o.max_queued_bytes_per_peer;
  shares.unread_bytes = o.max_unread_reply_bytes_total;
  shares.unread_bytes_per_peer = o.max_unread_reply_bytes_per_peer;
  return shares;
}

Code CodeOf(const v1::Envelope& reply) {
  return reply.has_error() ? static_cast<Code>(reply.error().code()) : Code::kOk;
}

}  // namespace

ClientServer::ClientServer(uv_loop_t* loop, const Options& options, RequestHandler on_request,
                           ClosedHandler on_closed)
    : loop_(loop),
      options_(options),
      http_access_(std::make_shared<HttpAccess>(HttpAccess{options.admin_token, options.api_keys, options.cors_origins})),
      on_request_(std::move(on_request)),
      on_closed_(std::move(on_closed)),
      accounting_(SharesOf(options)) {}

ClientServer::~ClientServer() { Close(); }

namespace {

template <typename Secret>
void LogReload(const SecretReload<Secret>& reload) {
  if (reload.error) {
    spdlog::error("{}", reload.log);
  } else if (!reload.log.empty()) {
    spdlog::info("{}", reload.log);
  }
}

}  // namespace

// The sessions read http_access_ at each request: what changes here serves from the next one.
void ClientServer::ReloadSecrets(const std::string& api_keys_file, const std::string& admin_token_file) {
  ApiKeysReload keys = supervisor::ReloadApiKeys(api_keys_file, !options_.api_keys.empty());
  if (keys.value) {
    options_.api_keys = *keys.value;
    http_access_->api_keys = std::move(*keys.value);
  }
  LogReload(keys);
  AdminTokenReload token = supervisor::ReloadAdminToken(admin_token_file, !options_.admin_token.empty());
  if (token.value) {
    options_.admin_token = *token.value;
    http_access_->admin_token = std::move(*token.value);
  }
  LogReload(token);
}

void ClientServer::Close() {
  StopAccepting();
  if (idle_timer_.active()) uv_timer_stop(idle_timer_.get());
  if (sniff_timer_.active()) uv_timer_stop(sniff_timer_.get());
  auto sessions = std::move(sessions_);
  sessions_.clear();
  for (auto& [id, session] : sessions) session.Close(Error(Code::kUnavailable, "daemon stopping"));
}

uint64_t ClientServer::Session::Unread() const {
  if (connection != nullptr) return connection->pending_write_bytes();
  if (http != nullptr) return http->pending_write_bytes();
  return 0;
}

void ClientServer::Session::Close(const Status& why) {
  if (connection != nullptr) return connection->Close(why);
  if (http != nullptr) return http->Close(why);
  sniff.reset();  // closes its handles; the descriptor is ours
  if (sniff_fd >= 0) close(sniff_fd);
  sniff_fd = -1;
}

http::ParserLimits ClientServer::HttpLimits() const {
  http::ParserLimits limits;
  limits.max_body_bytes = options_.max_frame_bytes;
  return limits;
}

void ClientServer::CloseSlowStarters() {
  const uint64_t now = uv_now(loop_);
  const uint64_t bound = options_.request_read_timeout_ms;
  std::vector<uint64_t> slow;
  std::vector<HttpSession*> idle;
  for (auto& [id, s] : sessions_) {
    // Each timed from the first byte of what is being read, never from the last: a client that
    // trickles a byte now and then must not hold a connection (or a reserve place) for ever.
    const bool reserve_late = s.admission == Admission::kReserve && now - s.accepted_ms >= kReserveTimeoutMs;
    if (s.sniff_fd >= 0) {
      int waiting = 0;
      if (s.first_byte_ms == 0 && ioctl(s.sniff_fd, FIONREAD, &waiting) == 0 && waiting > 0) s.first_byte_ms = now;
      if (reserve_late || (s.first_byte_ms != 0 && now - s.first_byte_ms >= bound)) slow.push_back(id);
    } else if (s.connection != nullptr) {
      const uint64_t started = s.connection->frame_started_ms();
      if (reserve_late || (started != 0 && now - started >= bound)) slow.push_back(id);
    } else if (s.http != nullptr) {
      if ((reserve_late && s.http->quiet()) ||
          (s.http->mid_request() && s.http->reading() && now - s.http->request_started_ms() >= bound)) {
        slow.push_back(id);
      } else if (s.http->quiet() && s.outstanding.empty() &&
                 now - std::max(s.last_active_ms, s.http->last_read_ms()) >= kHttpKeepAliveMs) {
        idle.push_back(s.http);
      }
    }
  }
  for (uint64_t id : slow) TimeOutSession(id);
  for (HttpSession* h : idle) h->Close(Error(Code::kUnavailable, "idle HTTP connection"));
}

void ClientServer::TimeOutSession(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  Status why = Error(Code::kDeadlineExceeded,
                     "a request was not complete {} ms after its first byte ([limits] "
                     "request_read_timeout): closing the connection",
                     options_.request_read_timeout_ms);
  if (s.admission == Admission::kReserve) why = s.refusal;
  counters_.Refused(s.admission == Admission::kReserve ? s.reserve_reason : metrics::Refusal::kSlowRequest);
  s.close_counted = true;
  if (s.sniff_fd >= 0) {  // it never said what it speaks: nothing it would understand to say
    s.Close(why);
    return Forget(id);
  }
  if (s.http != nullptr) return s.http->EndWith(why, 408, /*linger=*/true);
  ipc::Connection* conn = s.connection;
  conn->Send(ipc::Frame(ErrorReply(0, why)));
  conn->Close(why);
}

HttpSession::Options ClientServer::HttpOptions(bool tcp, const Status& reserve_refusal) const {
  HttpSession::Options options;
  options.limits = HttpLimits();
  options.max_unread_bytes = options_.max_unread_reply_bytes;
  options.tcp = tcp;
  options.access = http_access_;
  options.reserve_refusal = reserve_refusal;
  return options;
}

HttpSession::Hooks ClientServer::HttpHooks(uint64_t id) {
  HttpSession::Hooks hooks;
  hooks.request = [this, id](v1::Envelope&& request, bool admin_token) {
    Accept(id, std::move(request), -1, admin_token);
  };
  // The reserved share of connections serves scrapes: a scrape answers for every client.
  hooks.metrics = [this] {
    counters_.connections = accounting_.connections();
    counters_.reserve_connections = accounting_.reserve_in_use();
    counters_.peers = accounting_.peers();
    std::string text = options_.metrics ? options_.metrics() : "";
    return text + metrics::RenderSessionMetrics(counters_);
  };
  hooks.closed = [this, id](const Status& why) { OnSessionClosed(id, why); };
  hooks.answered = [this](Code code) { counters_.Reply(metrics::Protocol::kHttp, code); };
  hooks.refused = [this](metrics::Refusal reason) { counters_.Refused(reason); };
  return hooks;
}

void ClientServer::OpenHttp(uint64_t id, int fd) {
  Session& s = sessions_[id];
  const Status refusal = s.admission == Admission::kReserve ? s.refusal : OkStatus();
  HttpSession::Options options = HttpOptions(/*tcp=*/false, refusal);
  options.reserve_reason = s.reserve_reason;
  HttpSession* http = HttpSession::OpenPipe(loop_, fd, options, HttpHooks(id));
  if (http == nullptr) return Forget(id);
  sessions_[id].http = http;
}

void ClientServer::OpenFramed(uint64_t id, int fd) {
  ipc::Connection::Options options;
  options.max_frame_bytes = options_.max_frame_bytes;
  options.max_pending_write_bytes = options_.max_unread_reply_bytes;
  options.farewell = [this, id](const Status& why) {
    if (auto it = sessions_.find(id); it != sessions_.end()) {
      counters_.Refused(metrics::Refusal::kMalformedFrame);
      it->second.close_counted = true;
    }
    return ipc::Frame(ErrorReply(0, why));
  };
  // Only a region request (its memfd) and a takeover request (its channel) carry a descriptor;
  // any other is closed.
  options.accept_fds = true;
  options.close_unclaimed_fds = true;
  options.max_held_fds = 4;
  options.batcher = options_.batcher;
  ipc::Connection* conn = ipc::Connection::Open(
      loop_, fd, options, [this, id](std::string_view body) { OnFrame(id, body); },
      [this, id](const Status& why) { OnSessionClosed(id, why); });
  if (conn == nullptr) return Forget(id);
  sessions_[id].connection = conn;
}

void ClientServer::OnSessionClosed(uint64_t id, const Status& why) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  // The connection cut itself off (Connection, HttpSession) past max_unread_reply_bytes: the
  // only close of that code that is not counted where it was decided.
  if (!it->second.close_counted && why.code() == Code::kResourceExhausted) {
    counters_.Refused(metrics::Refusal::kUnreadCutOff);
  }
  spdlog::debug("session {} closed: {}", id, why.ToString());
  Forget(id);
  if (on_closed_) on_closed_(id);
}

void ClientServer::Forget(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  for (const auto& [request_id, bytes] : s.outstanding) accounting_.RequestAnswered(s.key, bytes);
  accounting_.ConnectionClosed(s.key, s.admission);
  sessions_.erase(it);
  RefillReserve();
  ResumeAccepting();  // a descriptor came back
}

void ClientServer::CloseIdle() {
  uint64_t now = uv_now(loop_);
  std::vector<ipc::Connection*> idle;
  std::vector<HttpSession*> idle_http;
  for (auto& [id, s] : sessions_) {
    const uint64_t active = s.http != nullptr ? std::max(s.last_active_ms, s.http->last_read_ms())
                                              : s.last_active_ms;
    if (s.outstanding.empty() && s.Unread() == 0 && now - active >= options_.idle_timeout_ms) {
      if (s.connection != nullptr) idle.push_back(s.connection);
      if (s.http != nullptr) idle_http.push_back(s.http);
    }
  }
  for (HttpSession* h : idle_http) h->Close(Error(Code::kUnavailable, "idle"));
  for (ipc::Connection* c : idle) {
    std::string bytes = ipc::Frame(ErrorReply(
        0, Error(Code::kUnavailable, "closed after {} s without requests ([limits] idle_timeout)",
                 options_.idle_timeout_ms / 1000)));
    (void)::send(c->fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    c->Close(Error(Code::kUnavailable, "idle"));
  }
}

void ClientServer::CheckUnread() {
  std::vector<PeerAccounting::Unread> unread;
  for (auto& [id, s] : sessions_) {
    if (uint64_t bytes = s.Unread(); bytes != 0) unread.push_back({id, s.key, bytes});
  }
  for (const PeerAccounting::CutOff& cut : accounting_.OverUnread(std::move(unread))) {
    auto it = sessions_.find(cut.session);
    if (it == sessions_.end()) continue;
    counters_.Refused(metrics::Refusal::kUnreadCutOff);
    it->second.close_counted = true;
    it->second.Close(cut.why);
  }
}

void ClientServer::OnFrame(uint64_t session, std::string_view body) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  v1::Envelope request;
  if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    spdlog::warn("session {} sent {} bytes that are not a warmpool Envelope; closing it", session,
                 body.size());
    counters_.Refused(metrics::Refusal::kMalformedFrame);
    s.close_counted = true;
    ipc::Connection* conn = s.connection;
    // After the replies already queued; Close writes what it can.
    conn->Send(ipc::Frame(ErrorReply(
        0, Error(Code::kInvalidArgument,
                 "received a frame that is not a warmpool Envelope: is this a warmpool client "
                 "of protocol version {}?",
                 ipc::kProtocolVersion))));
    conn->Close(Error(Code::kInvalidArgument, "malformed envelope"));
    return;
  }
  // A region request's memfd (a takeover's channel) is taken now, whatever becomes of the request,
  // so that it is never left for a later frame to take.
  const int fd = ipc::DescriptorsCarried(request) > 0 ? s.connection->TakeFd() : -1;
  if (s.admission == Admission::kReserve) {
    // Its request is read, so the client gets the answer rather than a broken pipe; then the
    // place goes back to the reserve.
    if (fd >= 0) close(fd);
    Refuse(s, request.request_id(), s.reserve_reason, s.refusal);
    s.close_counted = true;
    s.connection->Close(OkStatus());
    return;
  }
  Accept(session, std::move(request), fd, false);
}

void ClientServer::Refuse(Session& s, uint64_t request_id, metrics::Refusal reason, const Status& why) {
  counters_.Refused(reason);
  v1::Envelope refusal = ErrorReply(request_id, why);
  if (s.http != nullptr) s.http->OnReply(refusal);  // counted as it is written
  else SendFramed(s, refusal);
}

void ClientServer::SendFramed(Session& s, const v1::Envelope& reply) {
  counters_.Reply(metrics::Protocol::kFramed, CodeOf(reply));
  s.connection->Send(ipc::Frame(reply));  // may close it: a client past its unread bound
}

void ClientServer::Accept(uint64_t session, v1::Envelope&& request, int fd, bool admin_token) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    if (fd >= 0) close(fd);
    return;
  }
  Session& s = it->second;
  s.last_active_ms = uv_now(loop_);
  const uint64_t id = request.request_id();
  // Refusals are answered here and never handed on: the daemon keeps serving this client's
  // earlier requests and everybody else.
  auto refuse = [&](metrics::Refusal reason, const Status& why) {
    if (fd >= 0) close(fd);
    Refuse(s, id, reason, why);
  };
  if (s.outstanding.count(id) != 0) {
    // Two requests of one id cannot both be answered distinguishably, and the second would
    // overwrite the first wherever requests are tracked by id.
    return refuse(metrics::Refusal::kDuplicateRequestId,
                  Error(Code::kInvalidArgument,
                        "request id {} is already in use on this connection by a request not "
                        "answered yet: give every request its own id",
                        id));
  }
  if (s.outstanding.size() >= options_.max_requests_per_connection) {
    return refuse(metrics::Refusal::kRequestsPerConnection,
                  Error(Code::kResourceExhausted,
                        "this connection already has {} requests unanswered: wait for replies "
                        "before sending more, or raise [limits] max_requests_per_connection",
                        s.outstanding.size()));
  }
  const uint64_t bytes = request.ByteSizeLong();
  PeerAccounting::RequestVerdict share = accounting_.AdmitRequest(s.key, bytes);
  if (!share.ok) return refuse(share.reason, share.why);
  s.outstanding.emplace(id, bytes);
  Peer peer = s.peer;  // the handler may close (and erase) the session
  peer.admin_token = admin_token;
  on_request_(session, peer, std::move(request), fd);
}

void ClientServer::Send(uint64_t session, const v1::Envelope& reply) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  // A generation's chunk is no answer: its request stays outstanding until the final reply.
  if (auto r = s.outstanding.find(reply.request_id()); r != s.outstanding.end() && !reply.has_generate_chunk()) {
    accounting_.RequestAnswered(s.key, r->second);
    s.outstanding.erase(r);
  }
  s.last_active_ms = uv_now(loop_);
  if (HttpSession* http = s.http) {
    http->OnReply(reply);  // may close it; counted as it is written
  } else {
    SendFramed(s, reply);
  }
  // Only a session that holds a lot unread can put its peer or everybody over a bound: look then.
  it = sessions_.find(session);
  if (it != sessions_.end() && it->second.Unread() >= kUnreadCheckBytes) CheckUnread();
}

}  // namespace warmpool::supervisor
