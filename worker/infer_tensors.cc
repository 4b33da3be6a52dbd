// Typed tensors (InferRequest.inputs; engine ABI version 5): one engine run call, alone, its
// outputs into the reply. The inputs are copied into 8-byte-aligned memory (protobuf's bytes are
// not aligned for an i64); the engine's checks are Engine::Run's (engines/engine_tensors.cc).
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "engines/tensors/tensor_proto.h"
#include "ipc/error_proto.h"
#include "worker/serving.h"

namespace warmpool::worker {

void Serving::HandleInferTensors(const v1::WorkerInfer& request) {
  v1::WorkerEnvelope reply;
  v1::WorkerInferDone* done = reply.mutable_infer_done();
  done->set_job(request.job());
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  Status status;
  if (engine == nullptr) {
    status = Error(Code::kUnavailable, "model {} is not loaded in worker {}", request.model(), options_.slot);
  } else if (!engine->runs_tensors()) {
    status = Error(Code::kFailedPrecondition,
                   "this model's engine (\"{}\") takes no typed tensors: send it a rows x cols f32 matrix (input)",
                   engine->vtable().name != nullptr ? engine->vtable().name : "?");
  } else if (request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms()) {
    status = Error(Code::kDeadlineExceeded, "the request's deadline passed before it ran");
  } else {
    status = tensors::CheckNamedTensors(request.inputs(), "input");
  }
  // Aligned copies of the inputs, viewed as the ABI's tensors.
  std::vector<std::vector<uint64_t>> aligned;
  std::vector<wp_tensor> inputs;
  if (status.ok()) {
    aligned.reserve(request.inputs_size());
    for (const v1::NamedTensor& t : request.inputs()) {
      wp_tensor view = tensors::ViewOf(t);
      std::vector<uint64_t>& copy = aligned.emplace_back((t.data().size() + 7) / 8);
      if (!t.data().empty()) std::memcpy(copy.data(), t.data().data(), t.data().size());
      view.data = copy.data();
      inputs.push_back(view);
    }
  }
  // The in-flight marker around the engine call, as for an inference (worker/infer.cc).
  Result<uint32_t> slot = status.ok() ? marks_.Take(request.request_id(), request.model()) : Result<uint32_t>(status);
  if (!slot.ok()) {
    status = slot.status();
  } else {
    JobFaults faults = outbox_.FaultsFor(request.job(), request.faults());
    faults.Hit("infer.after_take");
    uint64_t reply_bytes = 0;
    status = engine->Run(inputs, [&](const wp_tensor& output) -> Status {
      reply_bytes += output.bytes + 64 + 8 * output.rank;  // the message's tags and sizes, bounded
      if (request.max_output_bytes() != 0 && reply_bytes > request.max_output_bytes()) {
        return Error(Code::kResourceExhausted,
                     "the outputs take more than a reply frame's {} bytes ([limits] max_frame_bytes): send less "
                     "per request",
                     request.max_output_bytes());
      }
      tensors::CopyInto(output, done->add_outputs());
      return OkStatus();
    });
    faults.Hit("infer.mid");
    faults.Hit("infer.before_restore");
    marks_.Release(*slot);
  }
  if (!status.ok()) {
    done->clear_outputs();
    ipc::SetError(done->mutable_error(), status);
  }
  outbox_.Send(reply);
}

}  // namespace warmpool::worker
