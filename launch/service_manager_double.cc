#include "launch/service_manager_double.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ipc/socket_io.h"

namespace warmpool::launch {

namespace {

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

void ServiceManagerDouble::PrepareStart(DaemonSpec& spec) {
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
