#include "supervisor/takeover.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "client/client.h"
#include "ipc/socket_io.h"

namespace warmpool::supervisor {

namespace {

constexpr char kEnd[] = "END";
constexpr size_t kFdsPerMessage = ipc::kMaxFdsPerMessage;  // what RecvWithFds takes in one message
constexpr size_t kNamesBytes = 64 * 1024;

Status SendNamed(int channel, const std::vector<std::pair<int, std::string>>& named) {
  std::string names;
  std::vector<int> fds;
  for (const auto& [fd, name] : named) {
    names += name + "\n";
    if (fd >= 0) fds.push_back(fd);  // a name alone: a word (END)
  }
  if (ipc::SendWithFds(channel, names.data(), names.size(), fds) < 0) {
    return Error(Code::kUnavailable, "handing over: {}", std::strerror(errno));
  }
  return OkStatus();
}

}  // namespace

bool IsSeqpacketSocket(int fd) {
  int type = 0;
  socklen_t len = sizeof(type);
  return fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET;
}

Status CheckTakeover(const TakeoverAsk& ask) {
  if (ask.tcp || !ask.admin) {
    return Error(Code::kPermissionDenied,
                 "a takeover needs root, the daemon's user or a member of [access] admin_group");
  }
  if (!ask.seqpacket_channel) {
    return Error(Code::kInvalidArgument, "a takeover request carries one end of a SOCK_SEQPACKET socketpair");
  }
  if (ask.stopping) return Error(Code::kUnavailable, "this daemon is stopping");
  if (ask.under_service_manager) {
    return Error(Code::kFailedPrecondition,
                 "this daemon runs under a service manager: restart the service instead "
                 "(systemctl restart warmpool); its descriptor store keeps models warm");
  }
  if (!ask.accepting) return Error(Code::kUnavailable, "this daemon is not accepting connections");
  return OkStatus();
}

Status HandOver(int channel, int listen_fd, const std::vector<KeptWeights>& kept, const std::string& instance,
                const std::function<void()>& before_end) {
  timeval timeout{5, 0};
  setsockopt(channel, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  v1::KeptManifest manifest;
  manifest.set_instance(instance);
  manifest.set_sequence(1);
  std::vector<std::pair<int, std::string>> handles;
  for (const KeptWeights& k : kept) {
    if (!Keepable(k)) continue;
    const std::string name = KeptName(k, fmt::format("{:x}-t{}", getpid(), handles.size()));
    *manifest.add_models() = DescribeKept(k, name, RegionFingerprint(k.weights.handle));
    handles.emplace_back(k.weights.handle, name);
  }
  Result<int> manifest_fd = WriteManifest(manifest);
  if (!manifest_fd.ok()) return manifest_fd.status();
  Status sent = SendNamed(channel, {{listen_fd, kHandedSocketName}, {*manifest_fd, "wp.manifest.1"}});
  close(*manifest_fd);
  for (size_t i = 0; sent.ok() && i < handles.size(); i += kFdsPerMessage) {
    std::vector<std::pair<int, std::string>> chunk(
        handles.begin() + static_cast<std::ptrdiff_t>(i),
        handles.begin() + static_cast<std::ptrdiff_t>(std::min(handles.size(), i + kFdsPerMessage)));
    sent = SendNamed(channel, chunk);
  }
  if (!sent.ok()) return sent;
  if (before_end) before_end();
  return SendNamed(channel, {{-1, kEnd}});
}

Result<std::vector<PassedDescriptor>> TakeOver(const std::string& socket_path, int timeout_ms) {
  Result<std::unique_ptr<client::Client>> client = client::Client::Connect(socket_path);
  if (!client.ok()) {
    return Error(Code::kUnavailable, "--takeover: no daemon answers on {}: {}", socket_path,
                 client.status().message());
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) {
    return Error(Code::kInternal, "socketpair: {}", std::strerror(errno));
  }
  timeval timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(pair[0], SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt((*client)->fd(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  v1::Envelope request;
  request.mutable_takeover();
  Result<uint64_t> id = (*client)->Send(std::move(request), {pair[1]});
  close(pair[1]);  // the running daemon has its own copy now
  if (!id.ok()) {
    close(pair[0]);
    return id.status();
  }
  std::vector<PassedDescriptor> passed;
  auto fail = [&](Status status) -> Result<std::vector<PassedDescriptor>> {
    for (const PassedDescriptor& d : passed) close(d.fd);
    if (pair[0] >= 0) close(pair[0]);
    return status;
  };
  for (bool end = false; !end;) {
    std::vector<char> names(kNamesBytes);
    std::vector<int> fds;
    const ssize_t n = ipc::RecvWithFds(pair[0], names.data(), names.size(), fds);
    if (n <= 0) {
      for (int fd : fds) close(fd);
      // The daemon said why (not an admin, already stopping, ...), or it went away.
      Result<v1::Envelope> reply = (*client)->Wait(*id);
      if (reply.ok() && reply->has_error()) {
        return fail(Status(CodeFromInt(reply->error().code()), "--takeover refused: " + reply->error().message()));
      }
      return fail(Error(Code::kUnavailable, "--takeover: the daemon on {} handed nothing over{}", socket_path,
                        n < 0 ? fmt::format(" ({})", std::strerror(errno)) : std::string()));
    }
    std::vector<std::string> list;
    std::string text(names.data(), static_cast<size_t>(n));
    for (size_t at = 0; at < text.size();) {
      size_t line = text.find('\n', at);
      if (line == std::string::npos) line = text.size();
      if (line > at) list.push_back(text.substr(at, line - at));
      at = line + 1;
    }
    if (fds.empty() && list.size() == 1 && list[0] == kEnd) {
      end = true;
      continue;
    }
    for (size_t i = 0; i < fds.size(); i++) {
      passed.push_back({fds[i], i < list.size() ? list[i] : "unnamed"});
    }
  }
  close(pair[0]);
  pair[0] = -1;
  Result<v1::Envelope> reply = (*client)->Wait(*id);
  if (!reply.ok()) return fail(reply.status());
  if (reply->has_error()) {
    return fail(Status(CodeFromInt(reply->error().code()), "--takeover: " + reply->error().message()));
  }
  return passed;
}

}  // namespace warmpool::supervisor
