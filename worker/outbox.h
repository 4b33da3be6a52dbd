// Everything this worker tells the supervisor goes out here, from either thread: replies, load
// progress, fired faults and (cuda) requests for device memory and their release. The channel
// writes each frame whole under its own lock, so frames from the two threads never interleave; the
// order between them is whichever thread writes first. Reading the channel is the serving
// thread's alone (worker/serving.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/repeated_ptr_field.h>

#include "ipc/blocking_channel.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "worker/fault_injector.h"

namespace warmpool::worker {

class Outbox {
 public:
  Outbox(ipc::BlockingChannel& channel, uint32_t slot) : channel_(channel), slot_(slot) {}

  // A message lost here means the supervisor is gone: PR_SET_PDEATHSIG or the next read ends this
  // process, so nobody waits for it.
  void Send(const v1::WorkerEnvelope& message, const std::vector<int>& fds = {});
  // Frames already encoded (ipc::AppendFrame), written in one call: a batch's replies.
  void SendFramed(const std::string& frames);
  // The faults granted to a job, each reported to the supervisor before its action runs.
  JobFaults FaultsFor(uint64_t job, const google::protobuf::RepeatedPtrField<v1::Fault>& faults);

 private:
  ipc::BlockingChannel& channel_;
  const uint32_t slot_;
};

}  // namespace warmpool::worker
