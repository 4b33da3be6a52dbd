// One framed, non-blocking socket watched by the event loop (uv_poll_t on the raw fd, because
// libuv 1.44 cannot pass arbitrary descriptors with uv_write2). The supervisor uses it for clients
// and for worker channels alike: the loop only moves bytes here, decisions happen in the handlers.
//
// Lifetime: a Connection owns its fd and deletes itself once closed and its handle's close callback
// has run. The owner keeps a raw pointer and must forget it when on_close is called; on_close is
// called exactly once, after which no other handler runs.
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <uv.h>

#include "common/status.h"
#include "ipc/framing.h"

namespace warmpool::ipc {

class Connection;

// Coalesces writes: frames sent to a connection during one turn of the loop are written after
// every I/O callback of that turn (a uv_check handle), in one sendmsg per connection instead of
// one per frame. Under pipelined load a reply burst from a worker, or a client's burst of
// requests, then costs one system call per peer. It must outlive the connections that use it.
class WriteBatcher {
 public:
  explicit WriteBatcher(uv_loop_t* loop);
  ~WriteBatcher();
  WriteBatcher(const WriteBatcher&) = delete;
  WriteBatcher& operator=(const WriteBatcher&) = delete;

  void Schedule(Connection* connection);
  void Cancel(Connection* connection);

 private:
  void FlushAll();

  uv_check_t* check_;
  // Started while writes wait: an idle handle makes the loop poll without blocking, so that
  // frames queued outside the I/O phase (a timer's, a close callback's) are written this turn too.
  uv_idle_t* idle_;
  std::vector<Connection*> dirty_;
};

class Connection {
 public:
  // body: one complete frame, valid only during the call. Descriptors that arrive are queued in
  // arrival order; a handler whose message says it carries one takes it with TakeFd(). (A stream
  // socket does not say which frame a descriptor came with: recvmsg may return it together with
  // the bytes of earlier frames.)
  using FrameHandler = std::function<void(std::string_view body)>;
  using CloseHandler = std::function<void(const Status& why)>;

  struct Options {
    uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
    // A peer that does not read its replies is dropped once this many bytes wait to be written.
    size_t max_pending_write_bytes = 256u << 20;
    // Framed bytes sent (best effort) before closing on a framing error, e.g. an error envelope.
    std::function<std::string(const Status&)> farewell;
    bool accept_fds = false;  // false: descriptors a peer sends are closed on arrival
    // With accept_fds: descriptors no handler took by the time every frame that arrived is handled
    // (a descriptor comes with its frame's first byte) are closed, and a peer that has more than
    // max_held_fds waiting is cut off. For peers that are not trusted to send only what is asked.
    bool close_unclaimed_fds = false;
    size_t max_held_fds = 64;
    // Writes wait for the end of the loop's turn (see WriteBatcher); nullptr: written at once.
    WriteBatcher* batcher = nullptr;
  };

  static Connection* Open(uv_loop_t* loop, int fd, Options options, FrameHandler on_frame,
                          CloseHandler on_close);

  // Queues already framed bytes; fds go with the first byte. The connection sends duplicates it
  // makes now and closes once the frame is written (or dropped): the caller may close its own
  // descriptors at once, even while the frame waits behind others. Silently dropped once the
  // connection is closing; a descriptor that cannot be duplicated closes the connection.
  void Send(std::string bytes, std::vector<int> fds = {});
  // The oldest received descriptor not yet taken (the caller owns it), or -1.
  int TakeFd();
  // Reads and dispatches whatever the peer has already written (e.g. before it died).
  void Drain() {
    if (!closing_) OnReadable();
  }
  // Idempotent. Pending writes go out if the socket takes them at once; the rest is discarded.
  void Close(const Status& why);

  bool closing() const { return closing_; }
  int fd() const { return fd_; }
  size_t pending_write_bytes() const { return pending_bytes_; }
  // When the first byte of a frame not yet complete arrived (the loop's uv_now), or 0 when no
  // frame is partly read: a peer that trickles a frame is timed from its start, not from its
  // last byte, so that one byte now and then cannot hold the connection for ever.
  uint64_t frame_started_ms() const { return frame_started_ms_; }

 private:
  friend class WriteBatcher;
  Connection(int fd, Options options, FrameHandler on_frame, CloseHandler on_close);
  ~Connection();
  static void OnPoll(uv_poll_t* handle, int status, int events);
  void OnReadable();
  void Flush();
  void UpdateInterest();

  struct Pending {
    std::string bytes;
    size_t offset = 0;
    std::vector<int> fds;  // owned duplicates, closed once the first byte went out
  };
  static void CloseFds(Pending& p);

  int fd_;
  Options options_;
  FrameHandler on_frame_;
  CloseHandler on_close_;
  uv_poll_t* poll_ = nullptr;
  FrameDecoder decoder_;
  std::deque<int> received_fds_;
  std::deque<Pending> pending_;
  size_t pending_bytes_ = 0;
  int interest_ = 0;
  bool closing_ = false;
  bool scheduled_ = false;  // with the batcher, to be flushed at the end of this turn
  uint64_t frame_started_ms_ = 0;
};

}  // namespace warmpool::ipc
