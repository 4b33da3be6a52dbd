// The listeners of the client socket: binding (or adopting) the Unix socket, the loopback TCP
// listener, and starting and stopping the accepting. What is accepted, and how, is
// client_accept.cc; what a session does, client_server.cc.
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
#include "supervisor/listen_address.h"

namespace warmpool::supervisor {

Status ClientServer::Open(int taken, int activated, const std::string& path, std::optional<gid_t> group,
                          const std::string& http_listen) {
  Status listening = taken >= 0       ? Adopt(taken, /*owns_path=*/true)
                     : activated >= 0 ? Adopt(activated)
                                      : Listen(path, group);
  if (!listening.ok() || http_listen.empty()) return listening;
  if (Status s = ListenTcp(http_listen); !s.ok()) return s;
  spdlog::info("HTTP API and /metrics on http://{}{}{}", http_listen,
               options_.admin_token.empty() ? " (reads and infer only)" : " (admin token set)",
               options_.api_keys.empty() ? "" : fmt::format(", every request with one of {} API keys", options_.api_keys.size()));
  return OkStatus();
}

Status ClientServer::Listen(const std::string& path, std::optional<gid_t> group) {
  if (Status s = CheckSocketPath(path); !s.ok()) return s;
  sockaddr_un addr{};
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
  Result<sockaddr_storage> parsed = ParseListenAddress(address, !options_.api_keys.empty());
  if (!parsed.ok()) return parsed.status();
  sockaddr_storage storage = *parsed;
  uv_tcp_init(loop_, tcp_listener_.get());
  tcp_listener_.MarkInitialized();
  tcp_listener_.get()->data = this;
  int rc = uv_tcp_bind(tcp_listener_.get(), reinterpret_cast<sockaddr*>(&storage), 0);
  if (rc == 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(tcp_listener_.get()), 128,
                   [](uv_stream_t* server, int status) {
                     static_cast<ClientServer*>(server->data)->OnTcpConnection(status);
                   });
  }
  if (rc != 0) {
    tcp_listener_.Close();
    return Error(Code::kFailedPrecondition,
                 "cannot listen on {}: {} ([http] listen){}", address, uv_strerror(rc),
                 rc == UV_EAFNOSUPPORT || rc == UV_EADDRNOTAVAIL
                     ? "; under the shipped warmpool.service the network is off: install the "
                       "drop-in warmpool-http.conf (see docs/metrics.md)"
                     : "");
  }
  tcp_listening_ = true;
  return OkStatus();
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
  RefillReserve();
  // Slow requests are looked for at a tenth of their bound (at most every second): a request
  // is cut off between 1 and 1.1 times request_read_timeout after its first byte.
  const uint64_t period = std::clamp<uint64_t>(options_.request_read_timeout_ms / 10, 10, 1000);
  uv_timer_start(sniff_timer_.get(), [](uv_timer_t* t) {
    static_cast<ClientServer*>(t->data)->CloseSlowStarters();
  }, period, period);
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
  for (int fd : reserve_fds_) close(fd);
  reserve_fds_.clear();
}

}  // namespace warmpool::supervisor
