#include "top/top_source.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace warmpool::top {

namespace {

int OpenPidfd(int64_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
#else
  errno = ENOSYS;
  return -1;
#endif
}

// Open's own message covers a missing segment or another layout; a segment this user may not
// read deserves the remedy instead.
std::string SegmentRefusal(const std::string& instance, const Status& open_error) {
  const std::string path = "/dev/shm/" + shm::SharedSegment::NameFor(instance);
  if (access(path.c_str(), R_OK) != 0 && errno == EACCES) {
    return fmt::format(
        "{} is not readable by this user (the daemon's [access] observer_group may read it)", path);
  }
  return open_error.message();
}

}  // namespace

Result<std::unique_ptr<PoolSource>> PoolSource::Connect(const std::string& socket) {
  Result<std::unique_ptr<client::Client>> client = client::Client::Connect(socket);
  if (!client.ok()) return client.status();
  Result<v1::StatusReply> status = (*client)->GetStatus();
  if (!status.ok()) return status.status();
  std::unique_ptr<PoolSource> source(new PoolSource());
  source->daemon_ =
      DaemonInfo{socket, status->version(), status->backend(), status->instance(), "", 0};
  source->client_ = std::move(*client);
  if (std::optional<std::string> refused = source->UseSegment()) {
    source->daemon_.socket_reason = *refused;
  } else {
    source->client_.reset();  // from now on the daemon is not asked anything
  }
  return source;
}

std::optional<std::string> PoolSource::UseSegment() {
  if (daemon_.instance.empty()) {
    return std::string(
        "the daemon did not say which segment is its own (a warmpoold older than this "
        "client)");
  }
  Result<shm::SharedSegment> segment =
      shm::SharedSegment::Open(daemon_.instance, /*read_only=*/true);
  if (!segment.ok()) return SegmentRefusal(daemon_.instance, segment.status());
  const shm::SegmentHeader& header = segment->view().header();
  const int64_t pid = header.supervisor_pid;
  const uint64_t start_ticks = header.supervisor_start_ticks;
  // The pidfd is taken before the check: if the check then passes, the pidfd is the supervisor's
  // and not a process that reused its pid. It tells of the exit from the kernel, without polling.
  const int pidfd = OpenPidfd(pid);
  if (!shm::SupervisorAlive(pid, start_ticks)) {
    if (pidfd >= 0) close(pidfd);
    return fmt::format(
        "the segment's warmpoold (pid {}) is not a process seen from here (another pid "
        "namespace?)",
        pid);
  }
  pidfd_ = pidfd;
  start_ticks_ = start_ticks;
  daemon_.pid = pid;
  segment_ = std::move(*segment);
  return std::nullopt;
}

PoolSource::~PoolSource() {
  if (pidfd_ >= 0) close(pidfd_);
}

bool PoolSource::SupervisorExited() const {
  if (pidfd_ < 0) return !shm::SupervisorAlive(daemon_.pid, start_ticks_);  // no pidfd_open here
  pollfd fd{pidfd_, POLLIN, 0};
  return poll(&fd, 1, 0) > 0;
}

Result<PoolSample> PoolSource::Sample() {
  if (segment_) {
    // A stopped daemon removes the segment's name, but this mapping stays readable and frozen:
    // only the process itself says whether the numbers are live.
    if (SupervisorExited()) {
      return Error(Code::kUnavailable, "warmpoold (pid {}) has exited", daemon_.pid);
    }
    return SampleSegment(segment_->view());
  }
  Result<v1::StatusReply> status = client_->GetStatus();
  Result<v1::PsReply> ps = status.ok() ? client_->Ps() : Result<v1::PsReply>(status.status());
  if (!ps.ok()) {
    return Error(Code::kUnavailable, "warmpoold at {} stopped answering ({})", daemon_.socket,
                 ps.status().message());
  }
  return SampleReplies(*status, *ps);
}

}  // namespace warmpool::top
