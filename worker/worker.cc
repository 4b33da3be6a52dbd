#include "worker/worker.h"

#include <unistd.h>

#include <utility>

namespace warmpool::worker {

// serving_ is built before models_ and load_thread_ and only keeps references to them; it uses
// them once Run is called.
Worker::Worker(WorkerOptions options)
    : options_(std::move(options)),
      channel_(options_.channel_fd, options_.max_frame_bytes),
      outbox_(channel_, options_.slot),
      memory_(options_, outbox_),
      marks_(options_.slot, options_.generation),
      serving_(options_, channel_, outbox_, memory_, marks_, models_, load_thread_),
      load_thread_(options_, outbox_, memory_, marks_, models_) {}

Worker::~Worker() {
  // Stop first, then fail the grants: a load that a closed grant fails must find the loop stopping,
  // or the load thread would go on to the next job in the queue.
  load_thread_.Stop();
  memory_.CloseGrants();  // a load waiting for device memory will get none now
  load_thread_.Join();
}

Status Worker::Start() {
  Result<shm::SharedSegment> segment = shm::SharedSegment::Open(options_.instance, false);
  if (!segment.ok()) return segment.status();
  if (Status s = memory_.Open(); !s.ok()) return s;
  if (Status s = marks_.Attach(std::move(*segment)); !s.ok()) return s;
  v1::WorkerEnvelope hello;
  hello.mutable_hello()->set_slot(options_.slot);
  hello.mutable_hello()->set_generation(options_.generation);
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_backend(std::string(BackendName(options_.backend)));
  // Not through the outbox: a hello that cannot be written fails the start.
  if (Status s = channel_.Write(hello); !s.ok()) return s;
  load_thread_.Start();
  return OkStatus();
}

}  // namespace warmpool::worker
