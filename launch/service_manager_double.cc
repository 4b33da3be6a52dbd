#include "launch/service_manager_double.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>

#include "ipc/socket_io.h"
#include "ipc/warmpool.pb.h"
#include "ipc/warm_store.pb.h"

namespace warmpool::launch {

namespace {

constexpr char kSettle[] = "X-SETTLE=";  // Settle's marker: not a notification systemd knows
constexpr char kManifestPrefix[] = "wp.manifest.";

// The value of KEY= among the message's lines; empty when absent.
std::string Field(const std::string& message, const std::string& key) {
  size_t at = 0;
  while (at < message.size()) {
    size_t end = message.find('\n', at);
    if (end == std::string::npos) end = message.size();
    if (message.compare(at, key.size(), key) == 0) return message.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return {};
}

}  // namespace

Result<std::unique_ptr<ServiceManagerDouble>> ServiceManagerDouble::Open(const std::string& path, size_t max_fds) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(Code::kInternal, "socket: {}", std::strerror(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    close(fd);
    return Error(Code::kInvalidArgument, "notify socket path {} is too long", path);
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kInternal, "bind {}: {}", path, std::strerror(err));
  }
  std::unique_ptr<ServiceManagerDouble> double_(new ServiceManagerDouble(fd, path, max_fds));
  if (pipe2(double_->stop_pipe_, O_CLOEXEC) != 0) return Error(Code::kInternal, "pipe: {}", std::strerror(errno));
  double_->reader_ = std::thread([d = double_.get()] { d->ReadLoop(); });
  return double_;
}

ServiceManagerDouble::ServiceManagerDouble(int fd, std::string path, size_t max_fds)
    : fd_(fd), path_(std::move(path)), max_fds_(max_fds) {}

ServiceManagerDouble::~ServiceManagerDouble() {
  if (reader_.joinable()) {
    (void)!write(stop_pipe_[1], "x", 1);
    reader_.join();
  }
  for (int p : stop_pipe_) {
    if (p >= 0) close(p);
  }
  Clear();
  close(fd_);
  unlink(path_.c_str());
}

void ServiceManagerDouble::ReadLoop() {
  std::vector<char> buffer(64 * 1024);
  for (;;) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_pipe_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    std::vector<int> received;
    const ssize_t n = ipc::RecvWithFds(fd_, buffer.data(), buffer.size(), received);
    if (n < 0) continue;
    Take(std::string(buffer.data(), static_cast<size_t>(n)), received);
    for (int fd : received) close(fd);  // what the store did not keep
  }
}

void ServiceManagerDouble::Take(const std::string& message, std::vector<int>& fds) {
  std::lock_guard lock(mutex_);
  if (message.rfind(kSettle, 0) == 0) {
    settle_taken_ = std::max<uint64_t>(settle_taken_, std::strtoull(message.c_str() + std::strlen(kSettle), nullptr, 10));
    taken_.notify_all();
    return;
  }
  notifications_.push_back(message);
  // As systemd: FDNAME= names what comes with FDSTORE=1 ("stored" when missing); FDSTOREREMOVE=1
  // drops every descriptor kept under the name.
  std::string name = Field(message, "FDNAME=");
  if (Field(message, "FDSTOREREMOVE=") == "1") {
    for (auto it = stored_.begin(); it != stored_.end();) {
      if (it->first == name) {
        close(it->second);
        it = stored_.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (Field(message, "FDSTORE=") == "1") {
    if (name.empty()) name = "stored";
    for (int& fd : fds) {
      if (stored_.size() >= max_fds_) break;
      stored_.emplace_back(name, fd);
      fd = -1;
    }
    std::erase(fds, -1);
  }
}

void ServiceManagerDouble::Settle() {
  uint64_t marker = 0;
  {
    std::lock_guard lock(mutex_);
    marker = ++settle_sent_;
  }
  // A datagram socket's queue is first come, first served across senders: once the reader has
  // taken this marker it has taken everything that arrived before it.
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  const std::string message = kSettle + std::to_string(marker);
  const bool sent = sendto(fd, message.data(), message.size(), 0, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) ==
                    static_cast<ssize_t>(message.size());
  close(fd);
  if (!sent) return;
  std::unique_lock lock(mutex_);
  // Bounded: should the reader have stopped, the caller goes on with what was taken.
  taken_.wait_for(lock, std::chrono::seconds(10), [&] { return settle_taken_ >= marker; });
}

bool ServiceManagerDouble::WaitForKept(const std::function<bool(const v1::KeptManifest&)>& done,
                                       std::chrono::milliseconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    Settle();
    std::optional<v1::KeptManifest> manifest;
    {
      std::lock_guard lock(mutex_);
      manifest = ConsistentManifest();
    }
    if (manifest && done(*manifest)) return true;
    if (std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool ServiceManagerDouble::WaitForKept(size_t handles, std::chrono::milliseconds timeout) {
  return WaitForKept([&](const v1::KeptManifest& m) { return static_cast<size_t>(m.models_size()) == handles; },
                     timeout);
}

std::optional<v1::KeptManifest> ServiceManagerDouble::ConsistentManifest() const {
  int manifest_fd = -1;
  std::multiset<std::string> kept;
  for (const auto& [name, fd] : stored_) {
    if (name.rfind(kManifestPrefix, 0) != 0) {
      kept.insert(name);
    } else if (manifest_fd >= 0) {
      return std::nullopt;  // the old one goes after the new one is stored
    } else {
      manifest_fd = fd;
    }
  }
  if (manifest_fd < 0) return std::nullopt;
  std::string bytes;
  char buffer[64 * 1024];
  for (off_t at = 0;;) {
    const ssize_t n = pread(manifest_fd, buffer, sizeof(buffer), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
    at += n;
  }
  v1::KeptManifest manifest;
  if (!manifest.ParseFromString(bytes)) return std::nullopt;
  std::multiset<std::string> named;
  for (const v1::KeptModel& m : manifest.models()) named.insert(m.fd_name());
  if (named != kept) return std::nullopt;
  return manifest;
}

void ServiceManagerDouble::PrepareStart(DaemonSpec& spec) {
  Settle();
  std::lock_guard lock(mutex_);
  spec.env.push_back("NOTIFY_SOCKET=" + path_);
  spec.listen_fds.clear();
  for (const auto& [name, fd] : stored_) spec.listen_fds.emplace_back(fd, name);
}

std::vector<std::string> ServiceManagerDouble::Notifications() const {
  std::lock_guard lock(mutex_);
  return notifications_;
}

std::map<std::string, size_t> ServiceManagerDouble::Stored() const {
  std::lock_guard lock(mutex_);
  std::map<std::string, size_t> names;
  for (const auto& [name, fd] : stored_) names[name]++;
  return names;
}

size_t ServiceManagerDouble::stored_count() const {
  std::lock_guard lock(mutex_);
  return stored_.size();
}

void ServiceManagerDouble::Clear() {
  std::lock_guard lock(mutex_);
  for (const auto& [name, fd] : stored_) close(fd);
  stored_.clear();
}

}  // namespace warmpool::launch
