// The client socket: accepts connections, turns frames into Envelopes and hands them to the daemon,
// and sends replies back to the session that asked. A session that vanished simply stops receiving:
// replies to it are dropped, and nothing else is disturbed. Bad input (a frame over the limit, bytes
// that are not an Envelope) gets one error reply and the connection is closed.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include <uv.h>

#include "common/status.h"
#include "ipc/connection.h"
#include "ipc/uv_handle.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::supervisor {

// Who is on the other end of a session, from the kernel (SO_PEERCRED) at accept time.
struct Peer {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

class ClientServer {
 public:
  using RequestHandler =
      std::function<void(uint64_t session, const Peer& peer, v1::Envelope&& request)>;

  ClientServer(uv_loop_t* loop, uint32_t max_frame_bytes, uint32_t max_connections,
               RequestHandler on_request);
  ~ClientServer();

  // Binds path (mode 0600), removing a stale socket; refuses one that a live daemon answers on.
  Status Listen(const std::string& path);
  // Stops accepting and closes every session; removes the socket file.
  void Close();

  // Dropped when the session is gone.
  void Send(uint64_t session, const v1::Envelope& reply);
  bool HasSession(uint64_t session) const { return sessions_.count(session) != 0; }
  size_t session_count() const { return sessions_.size(); }

 private:
  void OnAcceptable();
  void OnFrame(uint64_t session, std::string_view body);

  uv_loop_t* loop_;
  uint32_t max_frame_bytes_;
  uint32_t max_connections_;
  RequestHandler on_request_;
  int listen_fd_ = -1;
  std::string path_;
  ipc::UvHandle<uv_poll_t> listen_poll_;
  uint64_t next_session_ = 1;
  struct Session {
    ipc::Connection* connection;
    Peer peer;
  };
  std::unordered_map<uint64_t, Session> sessions_;
};

// An error reply envelope.
v1::Envelope ErrorReply(uint64_t request_id, const Status& status);

}  // namespace warmpool::supervisor
