// Dynamic batching: requests for one model that reach a worker together are computed in one
// engine call and their outputs split back, as Triton's dynamic batcher and TorchServe's
// batch_size/max_batch_delay do. At batch 1 a dense layer streams all of its weights for one row;
// sixteen rows in one call stream them once for all sixteen.
//
// The supervisor pipelines a model's requests to its workers, so under load they queue in the
// worker's channel while it computes; the reader takes what is there, and what arrives within the
// first request's delay (which the supervisor sets only when other requests of the model are in
// flight, so that a lone client never waits), up to the engine's max_batch rows. Every request
// keeps its own in-flight marker, deadline, faults and reply; a request that cannot join (another
// model, another width, batching off) is handled right after the batch, in order.
#include <chrono>
#include <iterator>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "ipc/error_proto.h"
#include "ipc/framing.h"
#include "worker/serving.h"

namespace warmpool::worker {
namespace {

using Clock = std::chrono::steady_clock;

bool WellFormed(const v1::WorkerInfer& request) {
  const v1::Tensor& input = request.input();
  return input.rows() > 0 && input.data().size() == uint64_t{input.rows()} * input.cols() * sizeof(float);
}

// What a request must share with the first of a batch to join it. Copied out of the first
// request: the batch vector it lives in grows while gathering.
struct BatchKey {
  uint32_t model;
  uint32_t cols;
};

bool Joins(const BatchKey& key, const v1::WorkerInfer& next) {
  return next.batch() && next.model() == key.model && next.input().cols() == key.cols && WellFormed(next);
}

}  // namespace

Status Serving::GatherBatch(std::vector<v1::WorkerInfer>& batch) {
  const v1::WorkerInfer& first = batch.front();
  if (!first.batch() || !WellFormed(first)) return OkStatus();
  const BatchKey key{first.model(), first.input().cols()};
  const std::optional<uint32_t> max_rows = models_.MaxBatch(key.model);
  if (!max_rows) return OkStatus();
  uint64_t rows = first.input().rows();
  Clock::time_point until = Clock::now() + std::chrono::microseconds(first.batch_delay_us());
  while (rows < *max_rows) {
    Incoming next;
    if (!deferred_.empty()) {
      next = std::move(deferred_.front());
      deferred_.pop_front();
    } else {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(until - Clock::now()).count();
      if (!channel_.WaitForFrame(left)) break;  // left <= 0: only what has arrived already
      if (Status s = ReadIncoming(next); !s.ok()) return s;
    }
    if (HandleControl(next)) continue;
    if (!next.message.has_infer() || !Joins(key, next.message.infer()) ||
        rows + next.message.infer().input().rows() > *max_rows) {
      deferred_.push_front(std::move(next));
      break;
    }
    rows += next.message.infer().input().rows();
    // A request sent with no delay says no company is to be expected after it (the supervisor's
    // window to this worker is full, or nothing else of the model is in flight): take only what
    // has arrived already.
    if (next.message.infer().batch_delay_us() == 0) until = Clock::now();
    batch.push_back(std::move(*next.message.mutable_infer()));
  }
  return OkStatus();
}

void Serving::HandleInfers(std::vector<v1::WorkerInfer>& batch) {
  if (batch.size() == 1) return HandleInfer(batch.front());
  std::shared_ptr<Engine> engine = models_.Find(batch.front().model());
  if (engine == nullptr) {
    for (const v1::WorkerInfer& request : batch) HandleInfer(request);  // each answered UNAVAILABLE
    return;
  }
  struct Member {
    const v1::WorkerInfer* request;
    uint32_t slot;
    JobFaults faults;
    uint64_t first_row;
  };
  std::vector<Member> members;
  std::string replies;  // every reply's frame, written in one call
  uint64_t rows = 0;
  auto reply = [&](const v1::WorkerInfer& request, const Status& status, const float* rows_out, uint64_t count,
                   uint32_t out_cols) {
    v1::WorkerEnvelope message;
    v1::WorkerInferDone* done = message.mutable_infer_done();
    done->set_job(request.job());
    if (!status.ok()) {
      ipc::SetError(done->mutable_error(), status);
    } else {
      done->set_batch_rows(static_cast<uint32_t>(rows));
      v1::Tensor* output = done->mutable_output();
      output->set_rows(static_cast<uint32_t>(count));
      output->set_cols(out_cols);
      output->set_data(reinterpret_cast<const char*>(rows_out), count * out_cols * sizeof(float));
    }
    if (Status s = ipc::AppendFrame(replies, message); !s.ok()) {
      spdlog::error("worker {}: reply to job {} dropped: {}", options_.slot, request.job(), s.ToString());
    }
  };
  const uint32_t cols = batch.front().input().cols();
  size_t next = 0;
  for (; next < batch.size(); ++next) {
    const v1::WorkerInfer& request = batch[next];
    if (request.deadline_unix_ms() != 0 && UnixMillis() > request.deadline_unix_ms()) {
      reply(request, Error(Code::kDeadlineExceeded, "the request's deadline passed before it ran"), nullptr, 0, 0);
      continue;
    }
    // Each request has its marker, taken before the engine runs and cleared after: if this
    // process dies in between, the supervisor finds every one of them and runs them again.
    Result<uint32_t> slot = marks_.Take(request.request_id(), request.model());
    if (!slot.ok()) {
      // A full table: the batch runs with the markers it has, the rest after it (one at a time
      // they would each have found a marker, so none fails for being batched).
      if (!members.empty()) break;
      reply(request, slot.status(), nullptr, 0, 0);
      continue;
    }
    members.push_back({&request, *slot, outbox_.FaultsFor(request.job(), request.faults()), rows});
    rows += request.input().rows();
  }
  if (!members.empty()) {
    for (Member& m : members) m.faults.Hit("infer.after_take");
    // Protobuf bytes are not guaranteed to be aligned for float: one copy into the batch's input.
    input_.resize(rows * cols);
    for (const Member& m : members) {
      const std::string& data = m.request->input().data();
      std::memcpy(input_.data() + m.first_row * cols, data.data(), data.size());
    }
    const Status status = engine->Infer(input_, static_cast<uint32_t>(rows), cols, output_);
    for (Member& m : members) {
      m.faults.Hit("infer.mid");
      m.faults.Hit("infer.before_restore");
    }
    for (const Member& m : members) marks_.Release(m.slot);
    const uint32_t out_cols = engine->OutputColumns(cols);
    for (const Member& m : members) {
      reply(*m.request, status, output_.data() + m.first_row * out_cols, m.request->input().rows(), out_cols);
    }
  }
  outbox_.SendFramed(replies);
  if (next < batch.size()) {
    std::vector<v1::WorkerInfer> rest(std::make_move_iterator(batch.begin() + static_cast<ptrdiff_t>(next)),
                                      std::make_move_iterator(batch.end()));
    HandleInfers(rest);
  }
}

}  // namespace warmpool::worker
