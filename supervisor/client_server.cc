#include "supervisor/client_server.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include <spdlog/spdlog.h>

#include "http/request_parser.h"
#include "ipc/framing.h"

namespace warmpool::supervisor {

ClientServer::ClientServer(uv_loop_t* loop, const Options& options, RequestHandler on_request,
                           ClosedHandler on_closed)
    : loop_(loop),
      options_(options),
      on_request_(std::move(on_request)),
      on_closed_(std::move(on_closed)) {}

ClientServer::~ClientServer() { Close(); }

Status ClientServer::Listen(const std::string& path, std::optional<gid_t> group) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Error(Code::kInvalidArgument, "socket path \"{}\" is longer than {} bytes", path,
                 sizeof(addr.sun_path) - 1);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);

  // A socket file already there: in use if someone answers, stale otherwise.
  struct stat st{};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Error(Code::kFailedPrecondition,
                   "\"{}\" exists and is not a socket: remove it or pass --socket", path);
    }
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    bool live = probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      return Error(Code::kFailedPrecondition,
                   "another daemon is serving on {}: stop it or pass --socket", path);
    }
    unlink(path.c_str());
  }

  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(Code::kInternal, "socket: {}", std::strerror(errno));
  // Create the file with the final mode: no window in which others could connect.
  mode_t old_umask = umask(0177);
  int rc = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old_umask);
  if (rc != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kFailedPrecondition, "cannot bind {}: {}", path, std::strerror(err));
  }
  // The group gets in only after the file belongs to it: chown first, then widen the mode.
  if (group && (chown(path.c_str(), static_cast<uid_t>(-1), *group) != 0 ||
                chmod(path.c_str(), 0660) != 0)) {
    int err = errno;
    close(fd);
    unlink(path.c_str());
    return Error(Code::kFailedPrecondition,
                 "cannot give socket {} to group {}: {} (the daemon's user must be a member of "
                 "[access] socket_group)",
                 path, *group, std::strerror(err));
  }
  if (listen(fd, 512) != 0) {
    int err = errno;
    close(fd);
    unlink(path.c_str());
    return Error(Code::kFailedPrecondition, "cannot listen on {}: {}", path, std::strerror(err));
  }
  path_ = path;
  owns_path_ = true;
  StartPolling(fd);
  return OkStatus();
}

Status ClientServer::Adopt(int fd, bool owns_path) {
  int type = 0;
  socklen_t len = sizeof(type);
  int listening = 0;
  socklen_t len2 = sizeof(listening);
  sockaddr_un addr{};
  socklen_t addr_len = sizeof(addr);
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM ||
      getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len2) != 0 || !listening ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0 ||
      addr.sun_family != AF_UNIX) {
    return Error(Code::kFailedPrecondition,
                 "the socket passed by the service manager (fd {}) is not a listening Unix stream "
                 "socket: use ListenStream=/path/to/socket in warmpool.socket",
                 fd);
  }
  // Nonblocking for the accept loop, close-on-exec so that workers never inherit it.
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  path_ = addr_len > offsetof(sockaddr_un, sun_path) ? std::string(addr.sun_path) : "";
  owns_path_ = owns_path;
  StartPolling(fd);
  return OkStatus();
}

Status ClientServer::ListenTcp(const std::string& address) {
  // "HOST:PORT" or "[V6]:PORT".
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    size_t close = address.find("]:");
    if (close != std::string::npos) {
      host = address.substr(1, close - 1);
      port = address.substr(close + 2);
    }
  } else if (size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  char* end = nullptr;
  unsigned long number = std::strtoul(port.c_str(), &end, 10);
  sockaddr_storage storage{};
  bool parsed = !port.empty() && *end == '\0' && number <= 65535;
  bool loopback = false;
  if (parsed && uv_ip4_addr(host.c_str(), static_cast<int>(number),
                            reinterpret_cast<sockaddr_in*>(&storage)) == 0) {
    loopback = (ntohl(reinterpret_cast<sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  } else if (parsed && uv_ip6_addr(host.c_str(), static_cast<int>(number),
                                   reinterpret_cast<sockaddr_in6*>(&storage)) == 0) {
    loopback = IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(&storage)->sin6_addr);
  } else {
    parsed = false;
  }
  if (!parsed) {
    return Error(Code::kInvalidArgument,
                 "[http] listen \"{}\" is not HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464", address);
  }
  if (!loopback) {
    return Error(Code::kInvalidArgument,
                 "[http] listen \"{}\" is not a loopback address: the HTTP API has no TLS and its "
                 "reads need no credentials, so it serves only 127.0.0.0/8 or ::1 (put a proxy in "
                 "front of it to serve further)",
                 address);
  }
  uv_tcp_init(loop_, tcp_listener_.get());
  tcp_listener_.MarkInitialized();
  tcp_listener_.get()->data = this;
  int rc = uv_tcp_bind(tcp_listener_.get(), reinterpret_cast<sockaddr*>(&storage), 0);
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(tcp_listener_.get()), 128,
                   [](uv_stream_t* server, int status) {
                     if (status == 0) static_cast<ClientServer*>(server->data)->OnTcpConnection();
                   });
  }
  if (rc != 0) {
    tcp_listener_.Close();
    return Error(Code::kFailedPrecondition,
                 "cannot listen on {}: {} ([http] listen){}", address, uv_strerror(rc),
                 rc == UV_EAFNOSUPPORT || rc == UV_EADDRNOTAVAIL
                     ? "; under the shipped warmpool.service the network is off: install the "
                       "drop-in warmpool-http.conf (see the README)"
                     : "");
  }
  tcp_listening_ = true;
  return OkStatus();
}

void ClientServer::OnTcpConnection() {
  if (!tcp_listening_) return;
  const uint64_t id = next_session_++;
  HttpSession* http = HttpSession::AcceptTcp(loop_, reinterpret_cast<uv_stream_t*>(tcp_listener_.get()),
                                             HttpOptions(/*tcp=*/true), HttpHooks(id));
  if (http == nullptr) return;
  if (sessions_.size() >= options_.max_connections || tcp_sessions_ >= kMaxTcpSessions) {
    return http->Close(Error(Code::kResourceExhausted, "too many connections"));  // before it is a session
  }
  tcp_sessions_++;
  Session& s = sessions_[id];
  s.http = http;
  s.peer = Peer{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1), /*tcp=*/true, false};
  s.last_active_ms = uv_now(loop_);
}

void ClientServer::StartPolling(int fd) {
  listen_fd_ = fd;
  uv_poll_init(loop_, listen_poll_.get(), fd);
  listen_poll_.MarkInitialized();
  listen_poll_.get()->data = this;
  for (auto* timer : {&resume_timer_, &idle_timer_, &sniff_timer_}) {
    uv_timer_init(loop_, timer->get());
    timer->MarkInitialized();
    timer->get()->data = this;
  }
  reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  uv_timer_start(sniff_timer_.get(), [](uv_timer_t* t) {
    static_cast<ClientServer*>(t->data)->CloseSlowStarters();
  }, 1000, 1000);
  ResumeAccepting();
  if (options_.idle_timeout_ms != 0) {
    uint64_t period = std::clamp<uint64_t>(options_.idle_timeout_ms / 4, 10, 1000);
    uv_timer_start(idle_timer_.get(), [](uv_timer_t* t) {
      static_cast<ClientServer*>(t->data)->CloseIdle();
    }, period, period);
  }
}

void ClientServer::ResumeAccepting() {
  if (listen_fd_ < 0 || accepting_) return;
  accepting_ = true;
  uv_poll_start(listen_poll_.get(), UV_READABLE, [](uv_poll_t* h, int status, int) {
    if (status == 0) static_cast<ClientServer*>(h->data)->OnAcceptable();
  });
}

void ClientServer::PauseAccepting(uint64_t ms) {
  if (!accepting_) return;
  accepting_ = false;
  uv_poll_stop(listen_poll_.get());
  uv_timer_start(resume_timer_.get(), [](uv_timer_t* t) {
    static_cast<ClientServer*>(t->data)->ResumeAccepting();
  }, ms, 0);
}

void ClientServer::StopAccepting() {
  accepting_ = false;
  if (tcp_listening_) {
    tcp_listening_ = false;
    tcp_listener_.Close();
  }
  if (resume_timer_.active()) uv_timer_stop(resume_timer_.get());
  if (listen_poll_.active()) {
    uv_poll_stop(listen_poll_.get());
    listen_poll_.Close();
  }
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    listen_fd_ = -1;
    if (owns_path_) unlink(path_.c_str());
  }
  if (reserve_fd_ >= 0) {
    close(reserve_fd_);
    reserve_fd_ = -1;
  }
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
  std::vector<uint64_t> slow;
  std::vector<HttpSession*> done;
  for (auto& [id, s] : sessions_) {
    if (s.sniff_fd >= 0 && now - s.last_active_ms >= kSniffTimeoutMs) slow.push_back(id);
    if (s.http == nullptr) continue;
    const uint64_t quiet_for = now - std::max(s.last_active_ms, s.http->last_read_ms());
    if ((s.http->mid_request() && quiet_for >= kSniffTimeoutMs) ||
        (s.http->quiet() && s.outstanding == 0 && quiet_for >= kHttpKeepAliveMs)) {
      done.push_back(s.http);
    }
  }
  for (uint64_t id : slow) {
    sessions_[id].Close(OkStatus());
    sessions_.erase(id);
    ResumeAccepting();
  }
  for (HttpSession* h : done) h->Close(Error(Code::kUnavailable, "slow or idle HTTP connection"));
}

namespace {

void SendAndClose(int fd, const Status& why) {
  std::string bytes = ipc::Frame(ErrorReply(0, why));
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

}  // namespace

void ClientServer::OnOutOfDescriptors(int err) {
  // Each client waiting in the backlog is told why, through the one descriptor kept for it; the
  // ones that come later wait in the backlog until a session closes or the pause ends.
  uint32_t answered = 0;
  while (reserve_fd_ >= 0) {
    close(reserve_fd_);
    reserve_fd_ = -1;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      SendAndClose(fd, Error(Code::kResourceExhausted,
                             "warmpoold is out of file descriptors ({}): retry later; the operator "
                             "should raise its limit (LimitNOFILE=) or lower [limits] "
                             "max_connections",
                             std::strerror(err)));
      answered++;
    }
    reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) break;
  }
  refused_since_log_ += answered;
  uint64_t now = uv_now(loop_);
  if (now - last_refusal_log_ms_ >= 1000 || last_refusal_log_ms_ == 0) {
    spdlog::warn("out of file descriptors ({}, {} sessions open): {} clients refused since the last "
                 "report; accepting again when a session closes. Raise the limit (LimitNOFILE=) "
                 "or lower [limits] max_connections",
                 std::strerror(err), sessions_.size(), refused_since_log_);
    refused_since_log_ = 0;
    last_refusal_log_ms_ = now;
  }
  PauseAccepting(250);
}

void ClientServer::OnAcceptable() {
  for (int i = 0; i < 64 && accepting_; i++) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EMFILE || err == ENFILE) return OnOutOfDescriptors(err);
      if (err != EAGAIN && err != EWOULDBLOCK && err != EINTR && err != ECONNABORTED) {
        spdlog::warn("accept: {}", std::strerror(err));
        PauseAccepting(100);  // whatever it is, not in a tight loop
      }
      return;
    }
    if (sessions_.size() >= options_.max_connections) {
      SendAndClose(fd, Error(Code::kResourceExhausted,
                             "too many connections ({}): close idle clients or raise [limits] "
                             "max_connections",
                             sessions_.size()));
      continue;
    }
    Peer peer;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      peer = Peer{cred.pid, cred.uid, cred.gid};
    } else {
      peer.uid = static_cast<uid_t>(-1);  // unknown: treated as the least privileged
      peer.gid = static_cast<gid_t>(-1);
    }
    uint64_t id = next_session_++;
    Session& s = sessions_[id];
    s.peer = peer;
    s.last_active_ms = uv_now(loop_);
    s.sniff_fd = fd;
    Classify(id);
  }
}

void ClientServer::Classify(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  Session& s = it->second;
  char first[4];
  ssize_t n = recv(s.sniff_fd, first, sizeof(first), MSG_PEEK | MSG_DONTWAIT);
  const bool again = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  http::Sniffed what = n > 0 ? http::SniffFirstBytes(std::string_view(first, static_cast<size_t>(n)))
                             : http::Sniffed::kNeedMore;
  if (n == 0 || (n < 0 && !again)) {  // gone before saying anything
    s.Close(OkStatus());
    sessions_.erase(it);
    ResumeAccepting();
    return;
  }
  if (what == http::Sniffed::kNeedMore) {
    if (s.sniff == nullptr) {
      s.sniff = std::make_unique<SniffWatch>();
      SniffWatch& w = *s.sniff;
      w.server = this;
      w.session = id;
      uv_poll_init(loop_, w.poll.get(), s.sniff_fd);
      w.poll.MarkInitialized();
      w.poll.get()->data = &w;
      uv_timer_init(loop_, w.retry.get());
      w.retry.MarkInitialized();
      w.retry.get()->data = &w;
    }
    SniffWatch& w = *s.sniff;
    if (n > 0) {
      // Part of a method's name is there: the poll is level-triggered and would fire at every
      // turn of the loop for the bytes already waiting. Look again a little later instead.
      if (w.polling) uv_poll_stop(w.poll.get());
      w.polling = false;
      uv_timer_start(w.retry.get(), [](uv_timer_t* t) {
        auto* watch = static_cast<SniffWatch*>(t->data);
        watch->server->Classify(watch->session);
      }, 10, 0);
    } else if (!w.polling) {
      w.polling = true;
      uv_poll_start(w.poll.get(), UV_READABLE, [](uv_poll_t* h, int, int) {
        auto* watch = static_cast<SniffWatch*>(h->data);
        watch->server->Classify(watch->session);
      });
    }
    return;
  }
  const int fd = s.sniff_fd;
  s.sniff_fd = -1;
  s.sniff.reset();  // stops watching before another handle watches the same descriptor
  if (what == http::Sniffed::kHttp) OpenHttp(id, fd);
  else OpenFramed(id, fd);
}

HttpSession::Options ClientServer::HttpOptions(bool tcp) const {
  HttpSession::Options options;
  options.limits = HttpLimits();
  options.max_unread_bytes = options_.max_unread_reply_bytes;
  options.tcp = tcp;
  if (tcp) options.admin_token = options_.admin_token;  // on the Unix socket, peer credentials decide
  return options;
}

HttpSession::Hooks ClientServer::HttpHooks(uint64_t id) {
  HttpSession::Hooks hooks;
  hooks.request = [this, id](v1::Envelope&& request, bool admin_token) {
    Accept(id, std::move(request), -1, admin_token);
  };
  hooks.metrics = options_.metrics;
  hooks.closed = [this, id](const Status& why) { OnSessionClosed(id, why); };
  return hooks;
}

void ClientServer::OpenHttp(uint64_t id, int fd) {
  HttpSession* http = HttpSession::OpenPipe(loop_, fd, HttpOptions(/*tcp=*/false), HttpHooks(id));
  if (http == nullptr) {
    sessions_.erase(id);
    ResumeAccepting();
    return;
  }
  sessions_[id].http = http;
}

void ClientServer::OnSessionClosed(uint64_t id, const Status& why) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (it->second.peer.tcp) tcp_sessions_--;
  sessions_.erase(it);
  spdlog::debug("session {} closed: {}", id, why.ToString());
  ResumeAccepting();  // a descriptor came back
  if (on_closed_) on_closed_(id);
}

void ClientServer::OpenFramed(uint64_t id, int fd) {
  {
    ipc::Connection::Options options;
    options.max_frame_bytes = options_.max_frame_bytes;
    options.max_pending_write_bytes = options_.max_unread_reply_bytes;
    options.farewell = [](const Status& why) { return ipc::Frame(ErrorReply(0, why)); };
    // Only a region request (its memfd) and a takeover request (its channel) carry a descriptor;
    // any other is closed.
    options.accept_fds = true;
    options.close_unclaimed_fds = true;
    options.max_held_fds = 4;
    options.batcher = options_.batcher;
    ipc::Connection* conn = ipc::Connection::Open(
        loop_, fd, options,
        [this, id](std::string_view body) { OnFrame(id, body); },
        [this, id](const Status& why) { OnSessionClosed(id, why); });
    if (conn == nullptr) {
      sessions_.erase(id);
      ResumeAccepting();
      return;
    }
    sessions_[id].connection = conn;
  }
}

void ClientServer::CloseIdle() {
  uint64_t now = uv_now(loop_);
  std::vector<ipc::Connection*> idle;
  std::vector<HttpSession*> idle_http;
  for (auto& [id, s] : sessions_) {
    const uint64_t active = s.http != nullptr ? std::max(s.last_active_ms, s.http->last_read_ms())
                                              : s.last_active_ms;
    if (s.outstanding == 0 && s.Unread() == 0 && now - active >= options_.idle_timeout_ms) {
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

void ClientServer::CheckUnreadTotal() {
  for (;;) {
    uint64_t total = 0;
    Session* worst = nullptr;
    for (auto& [id, s] : sessions_) {
      uint64_t unread = s.Unread();
      total += unread;
      if (worst == nullptr || unread > worst->Unread()) worst = &s;
    }
    if (total <= options_.max_unread_reply_bytes_total || worst == nullptr) return;
    worst->Close(Error(Code::kResourceExhausted,
                       "this client leaves {} bytes of replies unread while the daemon holds {} "
                       "for all clients: disconnected",
                       worst->Unread(), total));
  }
}

void ClientServer::OnFrame(uint64_t session, std::string_view body) {
  v1::Envelope request;
  if (!request.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return;
    spdlog::warn("session {} sent {} bytes that are not a warmpool Envelope; closing it", session,
                 body.size());
    ipc::Connection* conn = it->second.connection;
    std::string bytes = ipc::Frame(ErrorReply(
        0, Error(Code::kInvalidArgument,
                 "received a frame that is not a warmpool Envelope: is this a warmpool client "
                 "of protocol version {}?",
                 ipc::kProtocolVersion)));
    conn->Send(std::move(bytes));  // after the replies already queued; Close writes what it can
    conn->Close(Error(Code::kInvalidArgument, "malformed envelope"));
    return;
  }
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  // A region request's memfd (a takeover's channel) is taken now, whatever becomes of the request,
  // so that it is never left for a later frame to take.
  const bool carries = (request.has_region() && request.region().remove() == 0) || request.has_takeover();
  const int fd = carries ? it->second.connection->TakeFd() : -1;
  Accept(session, std::move(request), fd, false);
}

void ClientServer::Accept(uint64_t session, v1::Envelope&& request, int fd, bool admin_token) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    if (fd >= 0) close(fd);
    return;
  }
  Session& s = it->second;
  s.last_active_ms = uv_now(loop_);
  if (s.outstanding >= options_.max_requests_per_connection) {
    // Answered here and never handed on: the daemon keeps serving this client's earlier requests
    // and everybody else.
    v1::Envelope refusal = ErrorReply(
        request.request_id(),
        Error(Code::kResourceExhausted,
              "this connection already has {} requests unanswered: wait for replies before "
              "sending more, or raise [limits] max_requests_per_connection",
              s.outstanding));
    if (s.http != nullptr) s.http->OnReply(refusal);
    else s.connection->Send(ipc::Frame(refusal));
    if (fd >= 0) close(fd);
    return;
  }
  s.outstanding++;
  Peer peer = s.peer;  // the handler may close (and erase) the session
  peer.admin_token = admin_token;
  on_request_(session, peer, std::move(request), fd);
}

void ClientServer::Send(uint64_t session, const v1::Envelope& reply) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  if (it->second.outstanding > 0) it->second.outstanding--;
  it->second.last_active_ms = uv_now(loop_);
  if (HttpSession* http = it->second.http) {
    http->OnReply(reply);  // may close it
  } else {
    it->second.connection->Send(ipc::Frame(reply));  // may close it: a client past its unread bound
  }
  // Only a client that leaves a lot unread can make the total large: look then.
  it = sessions_.find(session);
  if (it != sessions_.end() && it->second.Unread() > (1u << 20)) CheckUnreadTotal();
}

}  // namespace warmpool::supervisor
