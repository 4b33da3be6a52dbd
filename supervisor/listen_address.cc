#include "supervisor/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include <uv.h>

#include "http/numbers.h"

namespace warmpool::supervisor {

Result<sockaddr_storage> ParseListenAddress(const std::string& address, bool with_api_keys) {
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
  Result<uint64_t> port_number = http::ParseDecimal(port, "the port", 0, 65535);
  const int number = port_number.ok() ? static_cast<int>(*port_number) : 0;
  sockaddr_storage storage{};
  bool parsed = port_number.ok();
  bool loopback = false;
  if (parsed && uv_ip4_addr(host.c_str(), number, reinterpret_cast<sockaddr_in*>(&storage)) == 0) {
    loopback = (ntohl(reinterpret_cast<sockaddr_in*>(&storage)->sin_addr.s_addr) >> 24) == 127;
  } else if (parsed && uv_ip6_addr(host.c_str(), number, reinterpret_cast<sockaddr_in6*>(&storage)) == 0) {
    loopback = IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(&storage)->sin6_addr);
  } else {
    parsed = false;
  }
  if (!parsed) {
    return Error(Code::kInvalidArgument,
                 "[http] listen \"{}\" is not HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464", address);
  }
  if (!loopback && !with_api_keys) {
    return Error(Code::kInvalidArgument,
                 "[http] listen \"{}\" is not a loopback address: without API keys the HTTP API's "
                 "reads and inference need no credentials, so it serves only 127.0.0.0/8 or ::1; set "
                 "[http] api_keys_file to serve further (and put a TLS proxy in front of it)",
                 address);
  }
  return storage;
}

Status CheckSocketPath(const std::string& path) {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return Error(Code::kInvalidArgument, "socket path \"{}\" is longer than {} bytes", path,
                 sizeof(sockaddr_un::sun_path) - 1);
  }
  const size_t slash = path.rfind('/');
  const std::string directory = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st{};
  if (stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Error(Code::kFailedPrecondition, "the socket's directory {} {}: create it or pass --socket",
                 directory, stat(directory.c_str(), &st) != 0 ? std::strerror(errno) : "is not a directory");
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor
