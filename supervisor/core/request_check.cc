#include "supervisor/core/request_check.h"

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/utf8.h"
#include "engines/tensors/tensor_proto.h"
#include "ipc/error_proto.h"
#include "ipc/fault_spec.h"
#include "ipc/framing.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::supervisor {

namespace {

// Compared by division: rows * cols may overflow for hostile values.
Status CheckInferInput(const v1::Tensor& input) {
  if (input.rows() == 0 || input.cols() == 0 || input.data().size() % sizeof(float) != 0 ||
      input.data().size() / sizeof(float) / input.rows() != input.cols() ||
      input.data().size() / sizeof(float) % input.rows() != 0) {
    return Error(Code::kInvalidArgument,
                 "input must be a non-empty rows x cols matrix of f32 (got {} x {} with {} bytes)",
                 input.rows(), input.cols(), input.data().size());
  }
  return OkStatus();
}

Status CheckSlice(const v1::RegionSlice& slice, const char* what) {
  if (slice.region() == 0 || slice.offset() % sizeof(float) != 0 || slice.bytes() == 0 ||
      slice.offset() + slice.bytes() < slice.offset()) {
    return Error(Code::kInvalidArgument,
                 "{} names region {} at offset {} for {} bytes: it needs a registered region, an "
                 "offset that is a multiple of 4 and at least one byte",
                 what, slice.region(), slice.offset(), slice.bytes());
  }
  return OkStatus();
}

// An input in a client's region: the tensor gives the shape, the slice holds exactly its bytes.
// The sampling options' ranges are the engine's to judge (engines/transformer/sampler.h): it
// names the option with the model's defaults in mind.
// Inputs of an embed request: how many, and valid UTF-8 (their length is bounded by the model's
// context: core/embed.cc).
Status CheckEmbed(const v1::EmbedRequest& e) {
  if (Status s = CheckModelName(e.model()); !s.ok()) return s;
  if (e.input_size() == 0 || e.input_size() > kMaxEmbedInputs) {
    return Error(Code::kInvalidArgument, "an embed request needs 1 to {} inputs, not {}", kMaxEmbedInputs,
                 e.input_size());
  }
  for (const std::string& input : e.input()) {
    if (input.empty()) return Error(Code::kInvalidArgument, "an input to embed is empty");
    if (!IsValidUtf8(input)) return Error(Code::kInvalidArgument, "an input to embed is not valid UTF-8");
  }
  return OkStatus();
}

// A tool's JSON, or a call's arguments: a JSON object of bounded size and depth.
Status CheckToolJson(const std::string& text, const char* what) {
  if (text.size() > kMaxToolJsonBytes) {
    return Error(Code::kInvalidArgument, "{} of {} bytes: at most {}", what, text.size(), kMaxToolJsonBytes);
  }
  if (!IsValidUtf8(text) || JsonNestingDepth(text, kMaxToolJsonDepth) > kMaxToolJsonDepth ||
      !nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false).is_object()) {
    return Error(Code::kInvalidArgument, "{} must be a JSON object (UTF-8, nested at most {} deep)", what,
                 kMaxToolJsonDepth);
  }
  return OkStatus();
}

Status CheckGenerate(const v1::GenerateRequest& g) {
  if (Status s = CheckModelName(g.model()); !s.ok()) return s;
  if (!g.prompt().empty() + !g.tokens().empty() + !g.messages().empty() != 1) {
    return Error(Code::kInvalidArgument,
                 "a generate request needs a prompt, token ids or messages (one of them, not both)");
  }
  if (!IsValidUtf8(g.prompt())) return Error(Code::kInvalidArgument, "the prompt is not valid UTF-8");
  if (g.messages_size() > kMaxMessages) {
    return Error(Code::kInvalidArgument, "{} messages: at most {}", g.messages_size(), kMaxMessages);
  }
  for (const v1::ChatMessage& m : g.messages()) {
    if (m.role().empty() || !IsValidUtf8(m.role()) || !IsValidUtf8(m.content())) {
      return Error(Code::kInvalidArgument, "a message needs a role, and its role and content must be valid UTF-8");
    }
    if (!IsValidUtf8(m.tool_call_id()) || !IsValidUtf8(m.name())) {
      return Error(Code::kInvalidArgument, "a message's tool_call_id and name must be valid UTF-8");
    }
    for (const v1::ToolCall& c : m.tool_calls()) {
      if (c.name().empty() || !IsValidUtf8(c.name()) || !IsValidUtf8(c.id())) {
        return Error(Code::kInvalidArgument, "a tool call needs a name, and its name and id must be valid UTF-8");
      }
      if (Status s = CheckToolJson(c.arguments(), "a tool call's arguments"); !s.ok()) return s;
    }
  }
  if (g.tools_size() > kMaxTools) {
    return Error(Code::kInvalidArgument, "{} tools: at most {}", g.tools_size(), kMaxTools);
  }
  for (const std::string& tool : g.tools()) {
    if (Status s = CheckToolJson(tool, "a tool"); !s.ok()) return s;
  }
  if (g.tools_size() > 0 && g.messages_size() == 0) {
    return Error(Code::kInvalidArgument, "tools are offered in a chat: send messages");
  }
  if (g.top_logprobs() > kMaxTopLogprobs) {
    return Error(Code::kInvalidArgument, "top_logprobs {}: at most {}", g.top_logprobs(), kMaxTopLogprobs);
  }
  if (g.top_logprobs() > 0 && !g.logprobs()) {
    return Error(Code::kInvalidArgument, "top_logprobs needs logprobs set too");
  }
  if (g.stop_size() > kMaxStopStrings) {
    return Error(Code::kInvalidArgument, "{} stop strings: at most {}", g.stop_size(), kMaxStopStrings);
  }
  for (const std::string& stop : g.stop()) {
    if (stop.empty() || stop.size() > kMaxStopBytes || !IsValidUtf8(stop)) {
      return Error(Code::kInvalidArgument, "a stop string must be 1 to {} bytes of valid UTF-8", kMaxStopBytes);
    }
  }
  return OkStatus();
}

// Typed tensors instead of a matrix: well-formed, in the frame (regions carry matrices only).
Status CheckTypedInputs(const v1::InferRequest& infer) {
  if (infer.has_input() || infer.has_input_region() || infer.has_output_region()) {
    return Error(Code::kInvalidArgument,
                 "an infer request sends typed tensors (inputs) or a matrix (input, regions), not both");
  }
  return tensors::CheckNamedTensors(infer.inputs(), "input");
}

Status CheckRegionInput(const v1::InferRequest& infer) {
  const v1::Tensor& input = infer.input();
  if (Status s = CheckSlice(infer.input_region(), "input_region"); !s.ok()) return s;
  const uint64_t bytes = infer.input_region().bytes();
  if (input.rows() == 0 || input.cols() == 0 || !input.data().empty() || bytes % sizeof(float) != 0 ||
      bytes / sizeof(float) % input.rows() != 0 || bytes / sizeof(float) / input.rows() != input.cols()) {
    return Error(Code::kInvalidArgument,
                 "an input in a region must be a non-empty rows x cols matrix of f32 whose slice "
                 "holds rows x cols x 4 bytes, with no data in the frame (got {} x {}, {} bytes in "
                 "the region, {} in the frame)",
                 input.rows(), input.cols(), bytes, input.data().size());
  }
  return OkStatus();
}

}  // namespace

v1::Envelope ErrorReply(uint64_t request_id, const Status& status) {
  v1::Envelope reply;
  reply.set_request_id(request_id);
  ipc::SetError(reply.mutable_error(), status);
  return reply;
}

Status CheckRequest(const v1::Envelope& request) {
  if (request.protocol_version() != 0 && request.protocol_version() != ipc::kProtocolVersion) {
    return Error(Code::kFailedPrecondition,
                 "client speaks protocol version {}, this daemon speaks {}: use a client of the "
                 "same release",
                 request.protocol_version(), ipc::kProtocolVersion);
  }
  switch (request.body_case()) {
    case v1::Envelope::kLoad: {
      const v1::LoadRequest& load = request.load();
      if (Status s = CheckModelName(load.model()); !s.ok()) return s;
      if (load.replicas() > kMaxRequestReplicas) {
        return Error(Code::kInvalidArgument,
                     "replicas {} is more than {}: ask for at most one per worker (0: as "
                     "configured)",
                     load.replicas(), kMaxRequestReplicas);
      }
      return OkStatus();
    }
    case v1::Envelope::kUnload:
      if (request.unload().all()) return OkStatus();  // the model is ignored
      return CheckModelName(request.unload().model());
    case v1::Envelope::kInfer: {
      // The shape first, as the daemon has always judged it.
      const v1::InferRequest& infer = request.infer();
      if (infer.inputs_size() > 0) {
        if (Status s = CheckTypedInputs(infer); !s.ok()) return s;
        return CheckModelName(infer.model());
      }
      Status shape = infer.has_input_region() ? CheckRegionInput(infer) : CheckInferInput(infer.input());
      if (!shape.ok()) return shape;
      if (infer.has_output_region()) {
        if (Status s = CheckSlice(infer.output_region(), "output_region"); !s.ok()) return s;
      }
      return CheckModelName(infer.model());
    }
    case v1::Envelope::kGenerate: return CheckGenerate(request.generate());
    case v1::Envelope::kEmbed: return CheckEmbed(request.embed());
    case v1::Envelope::kRegion:
      if (request.region().remove() == 0 && request.region().bytes() == 0) {
        return Error(Code::kInvalidArgument,
                     "a region needs bytes > 0 (and its memfd with the frame), or remove = its id");
      }
      return OkStatus();
    case v1::Envelope::kPin:
      return CheckModelName(request.pin().model());
    case v1::Envelope::kFaultArm: {
      const v1::FaultArmRequest& arm = request.fault_arm();
      if (Status s = ipc::CheckFaultPoint(arm.point()); !s.ok()) return s;
      if (Status s = ipc::CheckFaultAction(arm.action()); !s.ok()) return s;
      if (!arm.model().empty()) return CheckModelName(arm.model());  // empty: any model
      return OkStatus();
    }
    case v1::Envelope::kRegisterModel: {
      const v1::RegisterRequest& r = request.register_model();
      if (Status s = CheckModelName(r.model()); !s.ok()) return s;
      if (r.remove()) return OkStatus();
      // Relative paths would mean the daemon's working directory, which the client does not know;
      // where an absolute path leads is judged against the model roots later.
      if (r.path().empty() || r.path()[0] != '/' || r.path().find('\0') != std::string::npos) {
        return Error(Code::kInvalidArgument,
                     "model path \"{}\" must be absolute (the daemon does not share the "
                     "client's working directory)",
                     r.path());
      }
      return OkStatus();
    }
    case v1::Envelope::kModels:
    case v1::Envelope::kPs:
    case v1::Envelope::kStatus:
    case v1::Envelope::kFaultClear:
      return OkStatus();
    // No body, or one that only a daemon sends.
    case v1::Envelope::BODY_NOT_SET:
    case v1::Envelope::kError:
    case v1::Envelope::kLoadReply:
    case v1::Envelope::kUnloadReply:
    case v1::Envelope::kInferReply:
    case v1::Envelope::kModelsReply:
    case v1::Envelope::kPsReply:
    case v1::Envelope::kStatusReply:
    case v1::Envelope::kFaultArmReply:
    case v1::Envelope::kFaultClearReply:
    case v1::Envelope::kPinReply:
    case v1::Envelope::kRegisterModelReply:
    case v1::Envelope::kRegionReply:
      return Error(Code::kInvalidArgument,
                   "request {} carries no request this daemon understands (body {})",
                   request.request_id(), static_cast<int>(request.body_case()));
    default:
      // A body added to the protocol after this list: its handler judges it, and the daemon's
      // dispatch refuses a body it has no handler for.
      return OkStatus();
  }
}

bool IsAdminRequest(const v1::Envelope& request) {
  return request.has_load() || request.has_unload() || request.has_pin() ||
         request.has_fault_arm() || request.has_fault_clear() || request.has_register_model();
}

}  // namespace warmpool::supervisor
