#include "client/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/utf8.h"
#include "engines/tensors/tensor_proto.h"
#include "ipc/framing.h"
#include "common/paths.h"

namespace warmpool::client {

std::string DefaultSocketPath() {
  const char* env = std::getenv("WARMPOOL_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  // A daemon of this user's own first; else the system service's socket (warmpool.socket).
  std::string own = warmpool::DefaultSocketPath();
  if (access(own.c_str(), F_OK) != 0 && access(kSystemSocketPath, F_OK) == 0) return kSystemSocketPath;
  return own;
}

warmpool::Status StatusOf(const v1::Envelope& reply) {
  if (!reply.has_error()) return OkStatus();
  return warmpool::Status(CodeFromInt(reply.error().code()), reply.error().message());
}

Result<std::unique_ptr<Client>> Client::Connect(const std::string& socket_path,
                                                uint32_t max_frame_bytes) {
  sockaddr_un addr{};
  if (socket_path.size() >= sizeof(addr.sun_path)) {
    return Error(Code::kInvalidArgument, "socket path \"{}\" is too long", socket_path);
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error(Code::kInternal, "socket: {}", std::strerror(errno));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kUnavailable,
                 "cannot connect to warmpoold at {}: {} (is it running? start it with 'warmpoold', "
                 "or pass --socket / set WARMPOOL_SOCKET)",
                 socket_path, std::strerror(err));
  }
  return std::unique_ptr<Client>(new Client(fd, max_frame_bytes));
}

Client::Client(int fd, uint32_t max_frame_bytes) : fd_(fd), channel_(fd, max_frame_bytes) {}

Client::~Client() { close(fd_); }

Result<uint64_t> Client::Send(v1::Envelope request, const std::vector<int>& fds) {
  uint64_t id = next_request_id_++;
  request.set_request_id(id);
  if (!sent_version_) {
    request.set_protocol_version(ipc::kProtocolVersion);
    sent_version_ = true;
  }
  if (warmpool::Status s = channel_.Write(request, fds); !s.ok()) {
    // The daemon may have said why it closed the connection (too many connections, a refused
    // frame) before closing it: that reason beats "broken pipe". After the peer closed, the read
    // finds the bytes it left or end-of-file; it does not block.
    v1::Envelope farewell;
    if (s.code() == Code::kUnavailable && channel_.Read(farewell).ok() && farewell.request_id() == 0 && farewell.has_error()) {
      return StatusOf(farewell);
    }
    return s;
  }
  return id;
}

Result<v1::Envelope> Client::Receive() {
  if (!stash_.empty()) {
    v1::Envelope reply = std::move(stash_.begin()->second.front());
    stash_.begin()->second.pop_front();
    if (stash_.begin()->second.empty()) stash_.erase(stash_.begin());
    return reply;
  }
  v1::Envelope reply;
  if (warmpool::Status s = channel_.Read(reply); !s.ok()) {
    if (s.code() == Code::kUnavailable) {
      return Error(Code::kUnavailable, "warmpoold closed the connection ({})", s.message());
    }
    return s;
  }
  return reply;
}

Result<v1::Envelope> Client::Wait(uint64_t request_id) {
  if (auto it = stash_.find(request_id); it != stash_.end()) {
    v1::Envelope reply = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) stash_.erase(it);
    return reply;
  }
  for (;;) {
    v1::Envelope reply;
    if (warmpool::Status s = channel_.Read(reply); !s.ok()) {
      if (s.code() == Code::kUnavailable) {
        return Error(Code::kUnavailable, "warmpoold closed the connection ({})", s.message());
      }
      return s;
    }
    if (reply.request_id() == request_id) return reply;
    // request_id 0 is the daemon's word on the connection itself (e.g. a refused frame).
    if (reply.request_id() == 0 && reply.has_error()) return StatusOf(reply);
    const uint64_t id = reply.request_id();
    stash_[id].push_back(std::move(reply));
  }
}

Result<v1::Envelope> Client::Call(v1::Envelope request) {
  Result<uint64_t> id = Send(std::move(request));
  if (!id.ok()) return id.status();
  Result<v1::Envelope> reply = Wait(*id);
  if (!reply.ok()) return reply;
  if (warmpool::Status s = StatusOf(*reply); !s.ok()) return s;
  return reply;
}

Result<v1::GenerateReply> Client::Generate(v1::GenerateRequest request,
                                          const std::function<void(const v1::GenerateChunk&)>& on_chunk) {
  // Protobuf strings must be valid UTF-8: a frame that does not parse would end the connection.
  bool valid = IsValidUtf8(request.prompt());
  for (const std::string& stop : request.stop()) valid = valid && IsValidUtf8(stop);
  for (const v1::ChatMessage& m : request.messages()) valid = valid && IsValidUtf8(m.role()) && IsValidUtf8(m.content());
  if (!valid) return Error(Code::kInvalidArgument, "the prompt, a message or a stop string is not valid UTF-8");
  v1::Envelope envelope;
  *envelope.mutable_generate() = std::move(request);
  Result<uint64_t> id = Send(std::move(envelope));
  if (!id.ok()) return id.status();
  for (;;) {
    Result<v1::Envelope> reply = Wait(*id);
    if (!reply.ok()) return reply.status();
    if (reply->has_generate_chunk()) {
      if (on_chunk) on_chunk(reply->generate_chunk());
      continue;
    }
    if (warmpool::Status s = StatusOf(*reply); !s.ok()) return s;
    if (!reply->has_generate_reply()) {
      return Error(Code::kInternal, "warmpoold answered a generate request with something else");
    }
    return std::move(*reply->mutable_generate_reply());
  }
}

Result<v1::EmbedReply> Client::Embed(v1::EmbedRequest request) {
  for (const std::string& input : request.input()) {
    if (!IsValidUtf8(input)) return Error(Code::kInvalidArgument, "an input to embed is not valid UTF-8");
  }
  v1::Envelope envelope;
  *envelope.mutable_embed() = std::move(request);
  Result<v1::Envelope> reply = Call(std::move(envelope));
  if (!reply.ok()) return reply.status();
  if (!reply->has_embed_reply()) return Error(Code::kInternal, "warmpoold answered an embed request with something else");
  return std::move(*reply->mutable_embed_reply());
}

Result<v1::InferReply> Client::InferTensors(const std::string& model, std::vector<v1::NamedTensor> inputs,
                                            const InferOptions& options) {
  v1::Envelope envelope;
  v1::InferRequest* infer = envelope.mutable_infer();
  infer->set_model(model);
  infer->set_deadline_ms(options.deadline_ms);
  if (options.keep_alive_ms) infer->set_keep_alive_ms(*options.keep_alive_ms);
  for (v1::NamedTensor& t : inputs) *infer->add_inputs() = std::move(t);
  if (infer->inputs_size() == 0) return Error(Code::kInvalidArgument, "no input tensors");
  if (Status s = tensors::CheckNamedTensors(infer->inputs(), "input"); !s.ok()) return s;
  Result<v1::Envelope> reply = Call(std::move(envelope));
  if (!reply.ok()) return reply.status();
  if (!reply->has_infer_reply()) return Error(Code::kInternal, "warmpoold answered an infer request with something else");
  return std::move(*reply->mutable_infer_reply());
}

Result<uint64_t> Client::SendInfer(const std::string& model, const Matrix& input,
                                   const InferOptions& options) {
  return Send(InferRequest(model, input, options));
}

Result<v1::LoadReply> Client::Load(const std::string& model, const LoadOptions& options) {
  Result<v1::Envelope> reply = Call(LoadRequest(model, options));
  if (!reply.ok()) return reply.status();
  return reply->load_reply();
}

warmpool::Status Client::Unload(const std::string& model, bool park) {
  return Call(UnloadRequest(model, park)).status();
}

Result<v1::UnloadReply> Client::UnloadAll() {
  Result<v1::Envelope> reply = Call(UnloadAllRequest());
  if (!reply.ok()) return reply.status();
  return reply->unload_reply();
}

Result<Matrix> Client::Infer(const std::string& model, const Matrix& input,
                             const InferOptions& options) {
  if (region_threshold_ != 0 && input.data.size() * sizeof(float) >= region_threshold_) {
    return InferThroughRegion(model, input, options);
  }
  Result<v1::Envelope> reply = Call(InferRequest(model, input, options));
  if (!reply.ok()) return reply.status();
  return FromTensor(reply->infer_reply().output());
}

namespace {

uint64_t RoundUp(uint64_t bytes, uint64_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

Result<Matrix> Client::InferThroughRegion(const std::string& model, const Matrix& input,
                                          const InferOptions& options) {
  const uint64_t input_bytes = input.data.size() * sizeof(float);
  if (input.data.size() != uint64_t{input.rows} * input.cols) {
    return Error(Code::kInvalidArgument, "the input holds {} floats, not {} x {}", input.data.size(),
                 input.rows, input.cols);
  }
  // The output goes right after the input; room for the largest output seen so far, or for one
  // as large as the input (an output that does not fit comes in the reply, and the next region
  // is made large enough for it).
  const uint64_t output_offset = RoundUp(input_bytes, 4096);
  const uint64_t wanted = output_offset + std::max(input_bytes, largest_output_);
  if (own_region_.bytes() < wanted) {
    if (own_region_.id() != 0) {
      if (warmpool::Status s = DropRegion(own_region_); !s.ok()) return s;
    }
    Result<SharedRegion> region = SharedRegion::Create(RoundUp(wanted, 1u << 20));
    if (!region.ok()) return region.status();
    if (warmpool::Status s = RegisterRegion(*region); !s.ok()) return s;
    own_region_ = std::move(*region);
  }
  std::memcpy(own_region_.data(), input.data.data(), input_bytes);
  RegionTensors tensors{own_region_.id(), input.rows, input.cols, 0, output_offset,
                        own_region_.bytes() - output_offset};
  Result<v1::InferReply> reply = InferInRegion(model, tensors, options);
  if (!reply.ok()) return reply.status();
  if (!reply->output_in_region()) {
    Result<Matrix> out = FromTensor(reply->output());
    if (out.ok()) largest_output_ = std::max<uint64_t>(largest_output_, out->data.size() * sizeof(float));
    return out;
  }
  Matrix out;
  out.rows = reply->output().rows();
  out.cols = reply->output().cols();
  const uint64_t floats = uint64_t{out.rows} * out.cols;
  if (floats * sizeof(float) > tensors.output_bytes) {
    return Error(Code::kInternal, "the daemon says the output ({} x {}) is in a slice of {} bytes",
                 out.rows, out.cols, tensors.output_bytes);
  }
  out.data.resize(floats);
  std::memcpy(out.data.data(), own_region_.data() + output_offset, floats * sizeof(float));
  return out;
}

warmpool::Status Client::RegisterRegion(SharedRegion& region) {
  Result<uint64_t> id = Send(RegionRequest(region.bytes()), {region.fd()});
  if (!id.ok()) return id.status();
  Result<v1::Envelope> reply = Wait(*id);
  if (!reply.ok()) return reply.status();
  if (warmpool::Status s = StatusOf(*reply); !s.ok()) return s;
  region.set_id(reply->region_reply().region());
  return OkStatus();
}

warmpool::Status Client::DropRegion(SharedRegion& region) {
  warmpool::Status s = Call(RegionRemoveRequest(region.id())).status();
  if (s.ok()) region.set_id(0);
  return s;
}

Result<uint64_t> Client::SendInferInRegion(const std::string& model, const RegionTensors& tensors,
                                           const InferOptions& options) {
  return Send(InferInRegionRequest(model, tensors, options));
}

Result<v1::InferReply> Client::InferInRegion(const std::string& model, const RegionTensors& tensors,
                                             const InferOptions& options) {
  Result<v1::Envelope> reply = Call(InferInRegionRequest(model, tensors, options));
  if (!reply.ok()) return reply.status();
  return std::move(*reply->mutable_infer_reply());
}

Result<v1::PinReply> Client::Pin(const std::string& model, bool pin) {
  Result<v1::Envelope> reply = Call(PinRequest(model, pin));
  if (!reply.ok()) return reply.status();
  return reply->pin_reply();
}

Result<v1::RegisterReply> Client::Register(const std::string& model, const std::string& path,
                                           const std::string& engine) {
  Result<v1::Envelope> reply = Call(RegisterRequest(model, path, engine));
  if (!reply.ok()) return reply.status();
  return reply->register_model_reply();
}

Result<v1::RegisterReply> Client::Unregister(const std::string& model) {
  Result<v1::Envelope> reply = Call(UnregisterRequest(model));
  if (!reply.ok()) return reply.status();
  return reply->register_model_reply();
}

Result<uint64_t> Client::ArmFault(const FaultSpec& fault) {
  Result<v1::Envelope> reply = Call(FaultArmRequest(fault));
  if (!reply.ok()) return reply.status();
  return reply->fault_arm_reply().id();
}

Result<uint32_t> Client::ClearFaults() {
  Result<v1::Envelope> reply = Call(FaultClearRequest());
  if (!reply.ok()) return reply.status();
  return reply->fault_clear_reply().cleared();
}

Result<v1::ModelsReply> Client::Models() {
  Result<v1::Envelope> reply = Call(ModelsRequest());
  if (!reply.ok()) return reply.status();
  return reply->models_reply();
}

Result<v1::PsReply> Client::Ps() {
  Result<v1::Envelope> reply = Call(PsRequest());
  if (!reply.ok()) return reply.status();
  return reply->ps_reply();
}

Result<v1::StatusReply> Client::GetStatus() {
  Result<v1::Envelope> reply = Call(StatusRequest());
  if (!reply.ok()) return reply.status();
  return reply->status_reply();
}

}  // namespace warmpool::client
