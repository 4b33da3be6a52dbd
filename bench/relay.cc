#include "bench/relay.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>


#include <vector>

#include "ipc/framing.h"

namespace warmpool::bench {

namespace {

Result<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return Error(Code::kInvalidArgument, "socket path \"{}\" is too long", path);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = send(fd, data, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

uint32_t ReadPrefix(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

// Common start of a forked baseline process: die with the benchmark, never run its atexit code.
void BecomeChild(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGINT, SIG_IGN);  // the benchmark decides when we stop
}

[[noreturn]] void ServeEcho(int listener) {
  for (;;) {
    int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      _exit(1);
    }
    std::thread([conn] {
      ForwardFrames(conn, conn);
      close(conn);
    }).detach();
  }
}

[[noreturn]] void ServeRelay(int listener, const std::string& server_path) {
  for (;;) {
    int client = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      _exit(1);
    }
    Result<int> upstream = ConnectUnix(server_path);
    if (!upstream.ok()) {
      close(client);
      continue;
    }
    int server = *upstream;
    std::thread([client, server] {
      RelayPair(client, server);
      close(client);
      close(server);
    }).detach();
  }
}

}  // namespace

Result<int> ListenUnix(const std::string& path) {
  Result<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(Code::kInternal, "socket: {}", std::strerror(errno));
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un)) != 0 ||
      listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kInternal, "cannot listen on {}: {}", path, std::strerror(err));
  }
  return fd;
}

Result<int> ConnectUnix(const std::string& path) {
  Result<sockaddr_un> addr = UnixAddress(path);
  if (!addr.ok()) return addr.status();
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(Code::kInternal, "socket: {}", std::strerror(errno));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(sockaddr_un)) != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kUnavailable, "cannot connect to {}: {}", path, std::strerror(err));
  }
  return fd;
}

namespace {

// One direction of a relayed connection: bytes read from `in`, forwarded to `out` a whole frame at a
// time (everything up to the end of the last complete frame goes out in one write).
struct Direction {
  int in;
  int out;
  std::vector<char> buffer = std::vector<char>(256 * 1024);
  size_t have = 0;
};

// One recv and the writes it allows; false when the connection ended.
bool Pump(Direction& d) {
  ssize_t n = recv(d.in, d.buffer.data() + d.have, d.buffer.size() - d.have, 0);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) return false;
  d.have += static_cast<size_t>(n);
  size_t complete = 0;
  uint32_t pending_length = 0;
  bool pending = false;
  while (d.have - complete >= ipc::kFramePrefixBytes) {
    uint32_t length = ReadPrefix(d.buffer.data() + complete);
    if (length > ipc::kDefaultMaxFrameBytes) return false;  // hostile or corrupt: drop it
    if (d.have - complete - ipc::kFramePrefixBytes < length) {
      pending = true;
      pending_length = length;
      break;
    }
    complete += ipc::kFramePrefixBytes + length;
  }
  if (complete > 0) {
    if (!WriteAll(d.out, d.buffer.data(), complete)) return false;
    std::memmove(d.buffer.data(), d.buffer.data() + complete, d.have - complete);
    d.have -= complete;
  }
  // Room for the whole frame being received, so that it is forwarded in one write.
  size_t need = pending ? ipc::kFramePrefixBytes + pending_length : 0;
  if (need > d.buffer.size()) d.buffer.resize(need);
  if (d.have == d.buffer.size()) d.buffer.resize(d.buffer.size() * 2);
  return true;
}

}  // namespace

void ForwardFrames(int in, int out) {
  Direction d{in, out};
  while (Pump(d)) {
  }
}

void RelayPair(int client, int server) {
  // One thread and one poll over both directions, as warmpoold runs one loop over its sockets.
  Direction up{client, server}, down{server, client};
  pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents != 0 && !Pump(up)) return;
    if (fds[1].revents != 0 && !Pump(down)) return;
  }
}

Result<pid_t> ForkEchoServer(const std::string& socket_path) {
  Result<int> listener = ListenUnix(socket_path);
  if (!listener.ok()) return listener.status();
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(*listener);
    return Error(Code::kInternal, "fork: {}", std::strerror(err));
  }
  if (pid == 0) {
    BecomeChild(parent);
    ServeEcho(*listener);
  }
  close(*listener);
  return pid;
}

Result<pid_t> ForkRelay(const std::string& socket_path, const std::string& server_path) {
  Result<int> listener = ListenUnix(socket_path);
  if (!listener.ok()) return listener.status();
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(*listener);
    return Error(Code::kInternal, "fork: {}", std::strerror(err));
  }
  if (pid == 0) {
    BecomeChild(parent);
    ServeRelay(*listener, server_path);
  }
  close(*listener);
  return pid;
}

}  // namespace warmpool::bench
