// The C++ client library: one connection to warmpoold, blocking calls for every request of the
// protocol, and pipelining for callers that want several requests in flight (Send several, then
// Receive replies in any order, matched by request_id). Not thread-safe: one Client per thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/matrix.h"
#include "client/region.h"
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

  // Assigns a request_id (returned) and sends the request without waiting; fds travel with it
  // (a region's memfd).
  Result<uint64_t> Send(v1::Envelope request, const std::vector<int>& fds = {});
  Result<uint64_t> SendInfer(const std::string& model, const Matrix& input,
                             const InferOptions& options = {});
  // Next reply, whatever its request_id (stashed replies first).
  Result<v1::Envelope> Receive();
  // The reply to one request, stashing replies to others that arrive first.
  Result<v1::Envelope> Wait(uint64_t request_id);
  // Send + Wait; an error envelope becomes its Status.
  Result<v1::Envelope> Call(v1::Envelope request);

  // A language model's generation: with request.stream set, on_chunk gets each chunk in order as
  // it comes; the final reply is returned (an error after chunks is this call's Status). To stop
  // a generation early, close the connection: the daemon cancels it within a step.
  Result<v1::GenerateReply> Generate(v1::GenerateRequest request,
                                     const std::function<void(const v1::GenerateChunk&)>& on_chunk = nullptr);
  // Embeddings from a language model: one per input, in order, each at unit length.
  Result<v1::EmbedReply> Embed(v1::EmbedRequest request);
  // Typed tensors (client/typed_tensors.h builds them): the outputs the model's engine gives, by
  // name. Checked here first (well-formed, distinct names), as the daemon will.
  Result<v1::InferReply> InferTensors(const std::string& model, std::vector<v1::NamedTensor> inputs,
                                      const InferOptions& options = {});
  Result<v1::LoadReply> Load(const std::string& model, const LoadOptions& options = {});
  // park: keep a host copy (the daemon's park budget) so that the next load is a copy back.
  warmpool::Status Unload(const std::string& model, bool park = false);
  // Every loaded model, parked where the park budget allows; "N model(s), M parked".
  Result<v1::UnloadReply> UnloadAll();
  // Inputs of region_threshold() bytes or more go through a shared-memory region the client
  // keeps for itself (registered on first use, grown when needed), so the daemon never copies
  // them; smaller ones travel in the frame.
  Result<Matrix> Infer(const std::string& model, const Matrix& input,
                       const InferOptions& options = {});
  uint64_t region_threshold() const { return region_threshold_; }
  void set_region_threshold(uint64_t bytes) { region_threshold_ = bytes; }  // 0: never

  // Shared memory, for callers that place tensors themselves: a region stays registered (to this
  // connection only) until DropRegion or the connection closes.
  warmpool::Status RegisterRegion(SharedRegion& region);
  warmpool::Status DropRegion(SharedRegion& region);
  Result<uint64_t> SendInferInRegion(const std::string& model, const RegionTensors& tensors,
                                     const InferOptions& options = {});
  // The reply's output has the shape; its data is in the region when output_in_region, else in
  // the reply (it did not fit in tensors.output_bytes).
  Result<v1::InferReply> InferInRegion(const std::string& model, const RegionTensors& tensors,
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
  std::map<uint64_t, std::deque<v1::Envelope>> stash_;  // a generation's chunks share their id
  // Infer's own region for large inputs, and the largest output seen (its size for next time).
  Result<Matrix> InferThroughRegion(const std::string& model, const Matrix& input,
                                    const InferOptions& options);
  uint64_t region_threshold_ = 1u << 20;
  SharedRegion own_region_;
  uint64_t largest_output_ = 0;
};

// Status of an error envelope (ok for any other reply).
warmpool::Status StatusOf(const v1::Envelope& reply);

}  // namespace warmpool::client
