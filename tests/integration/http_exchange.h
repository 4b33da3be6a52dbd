// Raw HTTP/1.1 over a socket for the daemon-level tests of the HTTP API: what curl or any other
// client would see, bytes and all.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace warmpool::testing {

inline int ConnectUnix(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline int ConnectTcp(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Writes what the daemon takes (it may hang up first), then reads until it closes the connection.
inline std::string Exchange(int fd, const std::string& bytes) {
  if (fd < 0) return "";
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

struct Response {
  int status = 0;
  std::string headers;
  std::string body;
};

// Splits what came back into responses (Content-Length or chunked bodies).
inline std::vector<Response> Split(const std::string& bytes) {
  std::vector<Response> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t end = bytes.find("\r\n\r\n", pos);
    if (end == std::string::npos) break;
    Response r;
    r.headers = bytes.substr(pos, end - pos);
    r.status = std::atoi(r.headers.c_str() + 9);
    pos = end + 4;
    if (r.status == 204) {  // no body
    } else if (size_t cl = r.headers.find("Content-Length: "); cl != std::string::npos) {
      size_t n = std::strtoul(r.headers.c_str() + cl + 16, nullptr, 10);
      r.body = bytes.substr(pos, n);
      pos += n;
    } else {  // chunked
      for (;;) {
        size_t line = bytes.find("\r\n", pos);
        size_t n = std::strtoul(bytes.substr(pos, line - pos).c_str(), nullptr, 16);
        pos = line + 2;
        if (n == 0) {
          pos += 2;
          break;
        }
        r.body += bytes.substr(pos, n);
        pos += n + 2;
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

inline std::string HttpGet(const std::string& path, bool close = false) {
  return "GET " + path + " HTTP/1.1\r\nHost: warmpool\r\n" + (close ? "Connection: close\r\n" : "") + "\r\n";
}
inline std::string HttpPost(const std::string& path, const std::string& body, bool close = false,
                 const std::string& extra = "") {
  return "POST " + path + " HTTP/1.1\r\nHost: warmpool\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n" + extra + (close ? "Connection: close\r\n" : "") + "\r\n" + body;
}

}  // namespace warmpool::testing
