// One inference run alone: its input from the frame or from a client's region
// (worker/client_regions.h), its output into the reply or into the region. Batches of requests
// that share one engine call are worker/batching.cc.
#include <unistd.h>

#include <cstring>
#include <span>

#include "common/clock.h"
#include "ipc/error_proto.h"
#include "worker/serving.h"

namespace warmpool::worker {

void Serving::RegionFds::Close() {
  for (int* fd : {&input, &output}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void Serving::HandleInfer(const v1::WorkerInfer& request, RegionFds regions) {
  v1::WorkerEnvelope reply;
  v1::WorkerInferDone* done = reply.mutable_infer_done();
  done->set_job(request.job());
  std::shared_ptr<Engine> engine = models_.Find(request.model());
  const v1::Tensor& input = request.input();
  const uint64_t input_bytes = uint64_t{input.rows()} * input.cols() * sizeof(float);
  const uint64_t given_bytes =
      request.has_input_region() ? request.input_region().bytes() : input.data().size();
  Status status;
  if (engine == nullptr) {
    status = Error(Code::kUnavailable, "model {} is not loaded in worker {}", request.model(),
                   options_.slot);
  } else if (request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms()) {
    status = Error(Code::kDeadlineExceeded, "the request's deadline passed before it ran");
  } else if (given_bytes != input_bytes) {
    status = Error(Code::kInvalidArgument, "input holds {} bytes, not rows x cols x 4 = {}", given_bytes,
                   input_bytes);
  } else {
    // Tensors in a client's region are read and written in place (worker/client_regions.h).
    const uint64_t output_bytes = uint64_t{input.rows()} * engine->OutputColumns(input.cols()) * sizeof(float);
    const char* in_region = nullptr;
    char* out_region = nullptr;
    if (request.has_input_region()) {
      const v1::RegionSlice& slice = request.input_region();
      Result<char*> p = regions_.Slice(slice.region(), regions.input, slice.region_bytes(), slice.offset(),
                                       input_bytes, false);
      if (p.ok()) in_region = *p;
      else status = p.status();
    }
    if (status.ok() && request.has_output_region()) {
      const v1::RegionSlice& slice = request.output_region();
      Result<char*> p = output_bytes > slice.bytes()
                            ? Result<char*>(Error(Code::kInvalidArgument, "the output needs {} bytes, its slice has {}",
                                                  output_bytes, slice.bytes()))
                            : regions_.Slice(slice.region(), regions.output, slice.region_bytes(), slice.offset(),
                                             output_bytes, true);
      if (p.ok()) out_region = *p;
      else status = p.status();
    }
    // Take the in-flight marker before touching the engine and clear it after: if this process
    // dies in between, the supervisor finds the marker tagged with our (slot, generation).
    Result<uint32_t> slot = status.ok() ? marks_.Take(request.request_id(), request.model()) : Result<uint32_t>(status);
    if (!slot.ok()) {
      status = slot.status();
    } else {
      JobFaults faults = outbox_.FaultsFor(request.job(), request.faults());
      faults.Hit("infer.after_take");
      std::span<const float> in;
      if (in_region != nullptr) {
        in = {reinterpret_cast<const float*>(in_region), input_bytes / sizeof(float)};
      } else {
        // Protobuf bytes are not guaranteed to be aligned for float.
        input_.resize(input.data().size() / sizeof(float));
        std::memcpy(input_.data(), input.data().data(), input.data().size());
        in = input_;
      }
      std::span<float> out;
      if (out_region != nullptr) {
        out = {reinterpret_cast<float*>(out_region), output_bytes / sizeof(float)};
      } else {
        output_.resize(output_bytes / sizeof(float));
        out = output_;
      }
      status = engine->Infer(in, input.rows(), input.cols(), out);
      faults.Hit("infer.mid");
      faults.Hit("infer.before_restore");
      marks_.Release(*slot);
      if (status.ok()) {
        v1::Tensor* output = done->mutable_output();
        output->set_rows(input.rows());
        output->set_cols(engine->OutputColumns(input.cols()));
        if (out_region != nullptr) {
          done->set_output_in_region(true);
        } else {
          output->set_data(reinterpret_cast<const char*>(output_.data()), output_.size() * sizeof(float));
        }
        done->set_batch_rows(input.rows());
      }
    }
  }
  regions.Close();
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  outbox_.Send(reply);
}

}  // namespace warmpool::worker
