// Typed tensors (InferRequest.inputs; engine ABI version 5): one engine run call, its outputs into
// the reply. Judged as embeddings are: the engine's progress between the pieces of a long run is
// where the worker sends heartbeats, reads what the supervisor sent meanwhile (a cancel: its client
// left) and checks the deadline. The inputs are copied into 8-byte-aligned memory (protobuf's bytes
// are not aligned for an i64); the checks of inputs and outputs are Engine::Run's
// (engines/engine_tensors.cc).
#include <chrono>
#include <cstring>
#include <vector>

#include "common/clock.h"
#include "engines/tensors/tensor_proto.h"
#include "ipc/error_proto.h"
#include "worker/serving.h"

namespace warmpool::worker {

void Serving::HandleInferTensors(const v1::WorkerInfer& request) {
  const uint64_t job = request.job();
  v1::WorkerEnvelope reply;
  v1::WorkerInferDone* done = reply.mutable_infer_done();
  done->set_job(job);
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  Status unable = OkStatus();
  if (engine != nullptr && !engine->runs_tensors()) {
    unable = Error(Code::kFailedPrecondition,
                   "this model's engine (\"{}\") takes no typed tensors: send it a rows x cols f32 matrix (input)",
                   engine->vtable().name != nullptr ? engine->vtable().name : "?");
  } else if (engine != nullptr) {
    unable = tensors::CheckNamedTensors(request.inputs(), "input");
  }
  // Aligned copies of the inputs, viewed as the ABI's tensors (made before the marker is taken).
  std::vector<std::vector<uint64_t>> aligned;
  std::vector<wp_tensor> inputs;
  if (engine != nullptr && unable.ok()) {
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
  Result<uint32_t> slot = BeginLongJob(request, engine, unable);
  if (!slot.ok()) {
    ipc::SetError(done->mutable_error(), slot.status());
    outbox_.Send(reply);
    return;
  }
  JobFaults faults = outbox_.FaultsFor(job, request.faults());
  faults.Hit("infer.after_take");
  auto last_heard = std::chrono::steady_clock::now();
  bool past_deadline = false;
  uint64_t reply_bytes = 0;
  Status status = engine->Run(
      inputs,
      [&](const wp_tensor& output) -> Status {
        v1::NamedTensor* out = done->add_outputs();
        tensors::CopyInto(output, out);
        reply_bytes += out->ByteSizeLong() + 8;  // and its tag and length in the reply
        if (request.max_output_bytes() != 0 && reply_bytes > request.max_output_bytes()) {
          return Error(Code::kResourceExhausted,
                       "the outputs take more than a reply frame's {} bytes ([limits] max_frame_bytes): send less "
                       "per request",
                       request.max_output_bytes());
        }
        return OkStatus();
      },
      request.max_output_bytes(),
      [&](uint64_t, uint64_t) {
        HeartbeatIfDue(job, last_heard);
        if (!BetweenSteps(job)) return false;
        past_deadline = request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms();
        return !past_deadline;
      });
  faults.Hit("infer.mid");
  faults.Hit("infer.before_restore");
  marks_.Release(*slot);
  cancelled_.erase(job);
  if (!status.ok() && past_deadline) status = Error(Code::kDeadlineExceeded, "the run passed its deadline");
  if (!status.ok()) {
    done->clear_outputs();
    ipc::SetError(done->mutable_error(), status);
  }
  outbox_.Send(reply);
}

}  // namespace warmpool::worker
