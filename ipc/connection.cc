#include "ipc/connection.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ipc/socket_io.h"

namespace warmpool::ipc {

WriteBatcher::WriteBatcher(uv_loop_t* loop) : check_(new uv_check_t{}), idle_(new uv_idle_t{}) {
  uv_check_init(loop, check_);
  check_->data = this;
  uv_check_start(check_, [](uv_check_t* h) { static_cast<WriteBatcher*>(h->data)->FlushAll(); });
  uv_unref(reinterpret_cast<uv_handle_t*>(check_));  // never what keeps the loop running
  uv_idle_init(loop, idle_);
}

WriteBatcher::~WriteBatcher() {
  for (Connection* c : dirty_) c->scheduled_ = false;
  uv_check_stop(check_);
  uv_idle_stop(idle_);
  uv_close(reinterpret_cast<uv_handle_t*>(check_), [](uv_handle_t* h) { delete reinterpret_cast<uv_check_t*>(h); });
  uv_close(reinterpret_cast<uv_handle_t*>(idle_), [](uv_handle_t* h) { delete reinterpret_cast<uv_idle_t*>(h); });
}

void WriteBatcher::Schedule(Connection* connection) {
  if (dirty_.empty()) uv_idle_start(idle_, [](uv_idle_t*) {});
  dirty_.push_back(connection);
}

void WriteBatcher::Cancel(Connection* connection) { std::erase(dirty_, connection); }

void WriteBatcher::FlushAll() {
  // A flush may close a connection (a write error), which cancels it here, and its close handler
  // may send to others: take the list, and again until nothing waits. Connections are deleted only
  // in close callbacks, after this phase of the turn.
  while (!dirty_.empty()) {
    std::vector<Connection*> dirty;
    dirty.swap(dirty_);
    for (Connection* c : dirty) {
      if (!c->scheduled_) continue;
      c->scheduled_ = false;
      if (!c->closing_) c->Flush();
    }
  }
  uv_idle_stop(idle_);
}

Connection* Connection::Open(uv_loop_t* loop, int fd, Options options, FrameHandler on_frame,
                             CloseHandler on_close) {
  auto* c = new Connection(fd, options, std::move(on_frame), std::move(on_close));
  c->poll_ = new uv_poll_t{};
  int rc = uv_poll_init(loop, c->poll_, fd);
  if (rc != 0) {
    delete c->poll_;
    c->poll_ = nullptr;
    c->closing_ = true;
    c->on_close_(Error(Code::kInternal, "cannot watch fd {}: {}", fd, uv_strerror(rc)));
    delete c;
    return nullptr;
  }
  c->poll_->data = c;
  c->UpdateInterest();
  return c;
}

Connection::Connection(int fd, Options options, FrameHandler on_frame, CloseHandler on_close)
    : fd_(fd),
      options_(options),
      on_frame_(std::move(on_frame)),
      on_close_(std::move(on_close)),
      decoder_(options.max_frame_bytes) {}

Connection::~Connection() {
  if (scheduled_ && options_.batcher != nullptr) options_.batcher->Cancel(this);
  for (int fd : received_fds_) ::close(fd);
  for (Pending& p : pending_) CloseFds(p);
  if (fd_ >= 0) ::close(fd_);
}

void Connection::UpdateInterest() {
  if (closing_ || poll_ == nullptr) return;
  int want = UV_READABLE | UV_DISCONNECT | (pending_.empty() ? 0 : UV_WRITABLE);
  if (want == interest_) return;
  interest_ = want;
  uv_poll_start(poll_, want, &Connection::OnPoll);
}

void Connection::OnPoll(uv_poll_t* handle, int status, int events) {
  auto* c = static_cast<Connection*>(handle->data);
  if (status < 0) {
    // An error on the socket (e.g. the peer died with data unread) may still leave what the peer
    // wrote before it went: read that first.
    c->OnReadable();
    c->Close(Error(Code::kUnavailable, "socket error: {}", uv_strerror(status)));
    return;
  }
  if (events & UV_WRITABLE) c->Flush();
  if (!c->closing_ && (events & (UV_READABLE | UV_DISCONNECT))) c->OnReadable();
}

void Connection::OnReadable() {
  char buffer[64 * 1024];
  // Bounded rounds so that one busy peer cannot starve the rest of the loop.
  for (int round = 0; round < 16 && !closing_; round++) {
    std::vector<int> fds;
    ssize_t n = RecvWithFds(fd_, buffer, sizeof(buffer), fds);
    for (int fd : fds) {
      if (options_.accept_fds) received_fds_.push_back(fd);
      else ::close(fd);
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Close(Error(Code::kUnavailable, "read failed: {}", std::strerror(errno)));
      return;
    }
    if (n == 0) {
      Close(Error(Code::kUnavailable, "peer closed the connection"));
      return;
    }
    if (Status s = decoder_.Append({buffer, static_cast<size_t>(n)}); !s.ok()) {
      // Best effort: tell the peer why before hanging up, after the replies already queued (Close
      // writes what the socket takes at once); never block the loop for it.
      if (options_.farewell) Send(options_.farewell(s));
      Close(s);
      return;
    }
    if (options_.close_unclaimed_fds && received_fds_.size() > options_.max_held_fds) {
      Close(Error(Code::kInvalidArgument, "peer sent {} descriptors that no request asked for",
                  received_fds_.size()));
      return;
    }
    std::string_view body;
    while (!closing_ && decoder_.Next(body)) {
      frame_started_ms_ = 0;
      on_frame_(body);
    }
    if (closing_) return;
    if (decoder_.buffered() == 0) frame_started_ms_ = 0;
    else if (frame_started_ms_ == 0) frame_started_ms_ = std::max<uint64_t>(1, uv_now(poll_->loop));
    if (options_.close_unclaimed_fds && decoder_.buffered() == 0) {
      for (int fd : received_fds_) ::close(fd);
      received_fds_.clear();
    }
    if (static_cast<size_t>(n) < sizeof(buffer)) return;
  }
}

int Connection::TakeFd() {
  if (received_fds_.empty()) return -1;
  int fd = received_fds_.front();
  received_fds_.pop_front();
  return fd;
}

void Connection::CloseFds(Pending& p) {
  for (int fd : p.fds) ::close(fd);
  p.fds.clear();
}

void Connection::Send(std::string bytes, std::vector<int> fds) {
  if (closing_) return;
  // The frame owns what it carries: a descriptor named by number here could be closed (and its
  // number reused) by the caller before the frame's turn comes.
  std::vector<int> owned;
  for (int fd : fds) {
    int dup = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) {
      int err = errno;
      for (int d : owned) ::close(d);
      Close(Error(Code::kInternal, "cannot keep descriptor {} for a frame: {}", fd, std::strerror(err)));
      return;
    }
    owned.push_back(dup);
  }
  pending_bytes_ += bytes.size();
  pending_.push_back(Pending{std::move(bytes), 0, std::move(owned)});
  if (pending_bytes_ > options_.max_pending_write_bytes) {
    Close(Error(Code::kResourceExhausted,
                "peer does not read its replies ({} bytes pending): disconnected", pending_bytes_));
    return;
  }
  if (options_.batcher != nullptr) {
    // Written at the end of this turn of the loop, with whatever else is sent meanwhile.
    if (!scheduled_ && interest_ == (UV_READABLE | UV_DISCONNECT)) {
      scheduled_ = true;
      options_.batcher->Schedule(this);
    }
    return;
  }
  if (pending_.size() == 1) Flush();
  UpdateInterest();
}

void Connection::Flush() {
  constexpr size_t kMaxBuffers = 64;
  while (!pending_.empty() && !closing_) {
    // As many frames as one sendmsg takes, up to the next that carries descriptors: those go
    // with their frame's first byte, so such a frame can only start a write.
    iovec buffers[kMaxBuffers];
    size_t count = 0;
    std::span<const int> fds;
    for (auto it = pending_.begin(); it != pending_.end() && count < kMaxBuffers; ++it) {
      if (it != pending_.begin() && !it->fds.empty()) break;
      if (it == pending_.begin() && it->offset == 0) fds = it->fds;
      buffers[count++] = iovec{it->bytes.data() + it->offset, it->bytes.size() - it->offset};
    }
    ssize_t n = SendvWithFds(fd_, {buffers, count}, fds);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      int err = errno;
      // The peer is gone (EPIPE, ECONNRESET), but what it wrote before it went is still in our
      // receive queue: a worker's last replies and its fault report come first.
      OnReadable();
      Close(Error(Code::kUnavailable, "write failed: {}", std::strerror(err)));
      return;
    }
    CloseFds(pending_.front());  // the kernel holds its own references once the first byte is sent
    pending_bytes_ -= static_cast<size_t>(n);
    for (size_t left = static_cast<size_t>(n); left > 0;) {
      Pending& p = pending_.front();
      const size_t take = std::min(left, p.bytes.size() - p.offset);
      p.offset += take;
      left -= take;
      if (p.offset == p.bytes.size()) pending_.pop_front();
    }
  }
  UpdateInterest();
}

void Connection::Close(const Status& why) {
  if (closing_) return;
  closing_ = true;
  if (scheduled_ && options_.batcher != nullptr) options_.batcher->Cancel(this);
  scheduled_ = false;
  // Last replies go out if the socket takes them now (it is non-blocking); the rest is dropped.
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    std::span<const int> fds;
    if (p.offset == 0) fds = p.fds;
    ssize_t n = SendWithFds(fd_, p.bytes.data() + p.offset, p.bytes.size() - p.offset, fds);
    if (n <= 0) break;
    CloseFds(p);
    p.offset += static_cast<size_t>(n);
    if (p.offset < p.bytes.size()) break;
    pending_.pop_front();
  }
  for (Pending& p : pending_) CloseFds(p);
  pending_.clear();
  pending_bytes_ = 0;
  // on_frame_ may be the caller of Close: it stays alive until the connection is deleted.
  CloseHandler on_close = std::move(on_close_);
  if (poll_ != nullptr) {
    uv_poll_stop(poll_);
    uv_close(reinterpret_cast<uv_handle_t*>(poll_), [](uv_handle_t* h) {
      auto* self = static_cast<Connection*>(h->data);
      delete reinterpret_cast<uv_poll_t*>(h);
      delete self;
    });
    poll_ = nullptr;
  }
  if (on_close) on_close(why);
}

}  // namespace warmpool::ipc
