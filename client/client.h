// The C++ client library: one connection to warmpoold, blocking calls for every request of the
// protocol, and pipelining for callers that want several requests in flight (Send several, then
// Receive replies in any order, matched by request_id). Not thread-safe: one Client per thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/matrix.h"
#include "client/requests.h"
#include "common/status.h"
#include "ipc/blocking_channel.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::client {

// The default socket path shared with the daemon; WARMPOOL_SOCKET overrides it.
std::string DefaultSocketPath();

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
  Result<uint64_t> SendInfer(const std::string& model, const Matrix& input,
                             const InferOptions& options = {});
  // Next reply, whatever its request_id (stashed replies first).
  Result<v1::Envelope> Receive();
  // The reply to one request, stashing replies to others that arrive first.
  Result<v1::Envelope> Wait(uint64_t request_id);
  // Send + Wait; an error envelope becomes its Status.
  Result<v1::Envelope> Call(v1::Envelope request);

  Result<v1::LoadReply> Load(const std::string& model, const LoadOptions& options = {});
  // park: keep a host copy (the daemon's park budget) so that the next load is a copy back.
  warmpool::Status Unload(const std::string& model, bool park = false);
  // Every loaded model, parked where the park budget allows; "N model(s), M parked".
  Result<v1::UnloadReply> UnloadAll();
  Result<Matrix> Infer(const std::string& model, const Matrix& input,
                       const InferOptions& options = {});
  Result<v1::PinReply> Pin(const std::string& model, bool pin = true);
  Result<v1::RegisterReply> Register(const std::string& model, const std::string& path,
                                     const std::string& engine = "");
  Result<v1::RegisterReply> Unregister(const std::string& model);
  // The fault's id. Only a daemon started with --enable-fault-injection accepts faults.
  Result<uint64_t> ArmFault(const FaultSpec& fault);
  // How many armed faults were cleared.
  Result<uint32_t> ClearFaults();
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

}  // namespace warmpool::client
