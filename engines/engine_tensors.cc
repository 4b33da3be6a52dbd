// Engine::Run and Engine::Signature (engine ABI version 5): typed tensors through an engine's C
// ABI, with every tensor in and out checked by the one set of rules (engines/tensors/tensors.h):
// an engine's mistake (a bad signature, a bad output) is an INTERNAL error, never a malformed reply.
#include <cstring>
#include <string>
#include <vector>

#include "engines/builtin.h"
#include "engines/tensors/tensors.h"

namespace warmpool {
namespace {

struct SinkBridge {
  const Engine::SinkFn* sink;
  const char* engine;
  bool stated;                         // the signature names the outputs ...
  std::span<const wp_tensor> outputs;  // ... these
  std::vector<std::string> given;      // names already passed on
  Status refused;                      // the first error: the run returns it
};

wp_status SinkTrampoline(void* ctx, const wp_tensor* output) {
  auto* bridge = static_cast<SinkBridge*>(ctx);
  if (!bridge->refused.ok()) return static_cast<wp_status>(static_cast<int>(bridge->refused.code()));
  Status status = output == nullptr ? Error(Code::kInternal, "a null output") : tensors::CheckTensor(*output);
  if (status.ok() && bridge->given.size() >= tensors::kMaxTensors) {
    status = Error(Code::kInternal, "more than {} outputs", tensors::kMaxTensors);
  }
  if (status.ok()) {
    for (const std::string& name : bridge->given) {
      if (name == output->name) status = Error(Code::kInternal, "output \"{}\" twice", name);
    }
  }
  if (status.ok() && bridge->stated) {
    const wp_tensor* stated = nullptr;
    for (const wp_tensor& s : bridge->outputs) {
      if (std::strcmp(s.name, output->name) == 0) stated = &s;
    }
    status = tensors::MatchSignature({output, 1}, stated != nullptr ? std::span(stated, 1) : std::span(output, 0),
                                     "output");
  }
  // The engine's mistakes are INTERNAL whatever the check called them; the sink's own refusal (a
  // reply too large) keeps its code.
  if (!status.ok()) status = Error(Code::kInternal, "engine \"{}\" gave a bad output: {}", bridge->engine, status.message());
  if (status.ok()) {
    try {
      status = (*bridge->sink)(*output);
    } catch (const std::exception& e) {  // must not unwind through the engine's C frames
      status = Error(Code::kInternal, "taking output \"{}\": {}", output->name, e.what());
    }
  }
  if (!status.ok()) {
    bridge->refused = status;
    return static_cast<wp_status>(static_cast<int>(status.code()));
  }
  bridge->given.emplace_back(output->name);
  return WP_OK;
}

}  // namespace

Result<Engine::TensorSignature> Engine::Signature() const {
  if (instance_ == nullptr) return Error(Code::kFailedPrecondition, "engine is closed");
  const char* name = vtable_->name != nullptr ? vtable_->name : "?";
  if (!runs_tensors()) {
    return Error(Code::kFailedPrecondition, "engine \"{}\" takes no typed tensors (it has no run call)", name);
  }
  TensorSignature signature;
  if (vtable_->tensor_signature == nullptr) return signature;
  const wp_tensor* inputs = nullptr;
  const wp_tensor* outputs = nullptr;
  uint32_t input_count = 0, output_count = 0;
  wp_status status = vtable_->tensor_signature(instance_, &inputs, &input_count, &outputs, &output_count);
  if (status == WP_NOT_FOUND) return signature;
  if (status != WP_OK || (input_count > 0 && inputs == nullptr) || (output_count > 0 && outputs == nullptr) ||
      input_count > tensors::kMaxTensors || output_count > tensors::kMaxTensors) {
    return Error(Code::kInternal, "engine \"{}\" gave no valid tensor signature", name);
  }
  signature.stated = true;
  signature.inputs = {inputs, input_count};
  signature.outputs = {outputs, output_count};
  for (const auto& [list, what] : {std::pair{signature.inputs, "input"}, std::pair{signature.outputs, "output"}}) {
    if (Status s = tensors::CheckSignature(list, what); !s.ok()) {
      return Error(Code::kInternal, "engine \"{}\" gave a bad tensor signature: {}", name, s.message());
    }
  }
  return signature;
}

Status Engine::Run(std::span<const wp_tensor> inputs, const SinkFn& sink, uint64_t max_output_bytes,
                   const ProgressFn& progress) {
  Result<TensorSignature> signature = Signature();
  if (!signature.ok()) return signature.status();
  if (Status s = tensors::CheckTensors(inputs, "input"); !s.ok()) return s;
  if (signature->stated) {
    if (Status s = tensors::MatchSignature(inputs, signature->inputs, "input"); !s.ok()) return s;
  }
  SinkBridge bridge{&sink, vtable_->name != nullptr ? vtable_->name : "?", signature->stated, signature->outputs, {},
                    OkStatus()};
  char err[kErrorBufferBytes] = {};
  wp_status status = vtable_->run(instance_, inputs.data(), static_cast<uint32_t>(inputs.size()), max_output_bytes,
                                  &SinkTrampoline, &bridge, progress ? &ProgressTrampoline : nullptr,
                                  progress ? const_cast<ProgressFn*>(&progress) : nullptr, err, sizeof(err));
  if (!bridge.refused.ok()) return bridge.refused;
  if (status != WP_OK) return StatusFromWp(status, err);
  for (const wp_tensor& s : bridge.outputs) {
    bool given = false;
    for (const std::string& name : bridge.given) given = given || name == s.name;
    if (!given) return Error(Code::kInternal, "engine \"{}\" gave no output \"{}\"", vtable_->name, s.name);
  }
  return OkStatus();
}

}  // namespace warmpool
