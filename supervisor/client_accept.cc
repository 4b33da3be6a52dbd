// Accepting: who a new connection belongs to, whether it is served, goes to the reserve or is
// refused at once (supervisor/peer_limits.h decides), and what happens when the descriptors run
// out. In the spirit of nginx's ngx_event_accept.c: descriptors are kept open in reserve, one for
// each reserve place, so that under descriptor pressure a waiting client is still accepted, its
// request read and answered with why (a close before its request is read would reach it as a
// broken pipe); with the reserve spent, accepting pauses instead of spinning on EMFILE.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "http/request_parser.h"
#include "http/response.h"
#include "ipc/framing.h"
#include "supervisor/client_server.h"

namespace warmpool::supervisor {

namespace {

// Best effort, for a connection that cannot be given a place even in the reserve: in the words
// of its protocol when its first bytes are there already.
void SendAndClose(int fd, const Status& why) {
  char first[4];
  const ssize_t n = recv(fd, first, sizeof(first), MSG_PEEK | MSG_DONTWAIT);
  const bool http = n > 0 && http::SniffFirstBytes(std::string_view(first, static_cast<size_t>(n))) ==
                                 http::Sniffed::kHttp;
  std::string bytes = http ? http::ErrorResponse(why, false) : ipc::Frame(ErrorReply(0, why));
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

Peer PeerOf(int fd) {
  Peer peer;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer = Peer{cred.pid, cred.uid, cred.gid};
  } else {
    peer.uid = static_cast<uid_t>(-1);  // unknown: treated as the least privileged
    peer.gid = static_cast<gid_t>(-1);
  }
  return peer;
}

}  // namespace

void ClientServer::RefillReserve() {
  if (listen_fd_ < 0 && !tcp_listening_) return;  // not accepting: nothing to keep them for
  while (reserve_fds_.size() + accounting_.reserve_in_use() < options_.reserved_connections) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;  // taken again when a session closes
    reserve_fds_.push_back(fd);
  }
}

void ClientServer::LogRefusals(const char* what) {
  const uint64_t now = uv_now(loop_);
  if (now - last_refusal_log_ms_ < 1000 && last_refusal_log_ms_ != 0) return;
  spdlog::warn("{} ({} sessions open, {} in the reserve): {} clients refused at once since the "
               "last report; accepting again when a session closes. Raise the limit "
               "(LimitNOFILE=) or lower [limits] max_connections",
               what, sessions_.size(), accounting_.reserve_in_use(), refused_since_log_);
  refused_since_log_ = 0;
  last_refusal_log_ms_ = now;
}

void ClientServer::OnOutOfDescriptors(int err) {
  // Each client waiting in the backlog gets a place in the reserve, through a descriptor kept
  // for it; the ones that come later wait in the backlog until a session closes or the pause
  // ends.
  while (!reserve_fds_.empty() && accepting_) {
    close(reserve_fds_.back());
    reserve_fds_.pop_back();
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    refused_since_log_++;
    Admit(fd, PeerOf(fd), /*out_of_descriptors=*/true);
  }
  RefillReserve();  // what the loop freed and did not use
  LogRefusals(fmt::format("out of file descriptors ({})", std::strerror(err)).c_str());
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
    Admit(fd, PeerOf(fd), false);
  }
}

void ClientServer::Admit(int fd, const Peer& peer, bool out_of_descriptors) {
  PeerKey key;
  key.uid = peer.uid;
  ConnectionVerdict v = accounting_.AdmitConnection(key, out_of_descriptors);
  if (v.admission == Admission::kRefuse) {
    counters_.Refused(metrics::Refusal::kReserveFull);
    SendAndClose(fd, v.why);
    refused_since_log_++;
    LogRefusals("the reserve of connections is full");
    return;
  }
  if (v.admission == Admission::kReserve && !out_of_descriptors && !reserve_fds_.empty()) {
    close(reserve_fds_.back());  // the place's descriptor is this connection now
    reserve_fds_.pop_back();
  }
  uint64_t id = next_session_++;
  Session& s = sessions_[id];
  s.peer = peer;
  s.key = std::move(key);
  s.admission = v.admission;
  s.refusal = v.why;
  s.reserve_reason = v.reason;
  s.accepted_ms = s.last_active_ms = uv_now(loop_);
  s.sniff_fd = fd;
  Classify(id);
}

void ClientServer::OnTcpConnection(int status) {
  if (!tcp_listening_) return;
  if (status < 0) {  // libuv could not accept (EMFILE): it closed the connection itself
    counters_.Refused(metrics::Refusal::kOutOfDescriptors);
    refused_since_log_++;
    LogRefusals(fmt::format("TCP: cannot accept ({})", uv_strerror(status)).c_str());
    return;
  }
  const uint64_t id = next_session_++;
  HttpSession* http = HttpSession::AcceptTcp(loop_, reinterpret_cast<uv_stream_t*>(tcp_listener_.get()),
                                             HttpOptions(/*tcp=*/true, OkStatus()), HttpHooks(id));
  if (http == nullptr) return;
  PeerKey key;
  key.tcp = true;
  key.uid = static_cast<uid_t>(-1);
  key.address = http->PeerAddress();
  ConnectionVerdict v = accounting_.AdmitConnection(key);
  Session& s = sessions_[id];
  s.http = http;
  s.peer = Peer{0, static_cast<uid_t>(-1), static_cast<gid_t>(-1), /*tcp=*/true, false};
  s.key = std::move(key);
  s.admission = v.admission;
  s.refusal = v.why;
  s.reserve_reason = v.reason;
  s.accepted_ms = s.last_active_ms = uv_now(loop_);
  if (v.admission == Admission::kServe) return;
  if (v.admission == Admission::kReserve) {
    if (!reserve_fds_.empty()) {
      close(reserve_fds_.back());
      reserve_fds_.pop_back();
    }
    return http->SetReserve(v.why, v.reason);  // before its first bytes are read
  }
  // Told at once, without lingering: a refused connection must not hold a descriptor long.
  counters_.Refused(metrics::Refusal::kReserveFull);
  refused_since_log_++;
  LogRefusals("the reserve of connections is full");
  http->EndWith(v.why, 0, /*linger=*/false);
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
    return Forget(id);
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

}  // namespace warmpool::supervisor
