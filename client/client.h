// The C++ client library: one connection to warmpoold, blocking calls, and pipelining for callers
// that want several requests in flight (Send several, then Receive replies in any order, matched by
// request_id). Not thread-safe: use one Client per thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/blocking_channel.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::client {

// The default socket path shared with the daemon; WARMPOOL_SOCKET overrides it.
std::string DefaultSocketPath();

// A row-major f32 matrix.
struct Matrix {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<float> data;
};

class Client {
 public:
  // max_frame_bytes bounds the replies read. By default none but the protocol's (4 GiB): the
  // daemon bounds what it sends by its own [limits] max_frame_bytes.
  static Result<std::unique_ptr<Client>> Connect(const std::string& socket_path,
                                                 uint32_t max_frame_bytes = UINT32_MAX);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Assigns a request_id (returned) and sends the request without waiting.
  Result<uint64_t> Send(v1::Envelope request);
  // Next reply, whatever its request_id (stashed replies first).
  Result<v1::Envelope> Receive();
  // The reply to one request, stashing replies to others that arrive first.
  Result<v1::Envelope> Wait(uint64_t request_id);
  // Send + Wait; an error envelope becomes its Status.
  Result<v1::Envelope> Call(v1::Envelope request);

  Result<v1::LoadReply> Load(const std::string& model);
  warmpool::Status Unload(const std::string& model);
  Result<Matrix> Infer(const std::string& model, const Matrix& input, uint32_t deadline_ms = 0);
  Result<v1::ModelsReply> Models();
  Result<v1::PsReply> Ps();
  Result<v1::StatusReply> GetStatus();

  int fd() const { return fd_; }
  // The raw framed channel, for callers that frame requests themselves (tests, benchmarks).
  ipc::BlockingChannel& channel() { return channel_; }

 private:
  explicit Client(int fd, uint32_t max_frame_bytes);

  int fd_;
  ipc::BlockingChannel channel_;
  uint64_t next_request_id_ = 1;
  bool sent_version_ = false;
  std::map<uint64_t, v1::Envelope> stash_;
};

// Status of an error envelope (ok for any other reply).
warmpool::Status StatusOf(const v1::Envelope& reply);
v1::Tensor ToTensor(const Matrix& m);
Result<Matrix> FromTensor(const v1::Tensor& t);

}  // namespace warmpool::client
