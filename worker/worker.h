// warmpool-worker: one process per (device, slot), started by warmpoold with fork+exec. It holds
// engines and executes load / attach / park / unload / infer for the supervisor over an inherited
// socketpair.
//
// Two threads, each with its own part:
// - serving (worker/serving.h), the main thread: reads the channel and, in arrival order, answers
//   inferences and parks and runs unloads; hands the rest on.
// - the load thread (worker/load_thread.h): loads and attaches, so that a long load never stalls
//   inference on the models already here.
// and the parts both use, each with its own lock: the memory service (device memory, grants and
// offers: worker/memory_service.h), the engines by model (worker/model_table.h), the in-flight
// markers (worker/inflight_marks.h) and the outbox every reply goes through
// (worker/outbox.h). Worker owns them all and decides their order of construction and shutdown.
#pragma once

#include "common/status.h"
#include "ipc/blocking_channel.h"
#include "worker/inflight_marks.h"
#include "worker/load_thread.h"
#include "worker/memory_service.h"
#include "worker/model_table.h"
#include "worker/options.h"
#include "worker/outbox.h"
#include "worker/serving.h"

namespace warmpool::worker {

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Attaches the segment, opens the device and says hello; an error here is fatal configuration
  // (exit code 2). Starts the load thread.
  Status Start();
  // Serves on the calling thread until the supervisor closes the channel. Returns the process
  // exit code.
  int Run() { return serving_.Run(); }

 private:
  // Declared in the order they are built; destroyed in reverse: the load thread ends first, then
  // the engines close (freeing into memory_, which on cuda tells the supervisor through outbox_),
  // and the memory and the channel go last.
  WorkerOptions options_;
  ipc::BlockingChannel channel_;
  Outbox outbox_;
  MemoryService memory_;
  InflightMarks marks_;
  Serving serving_;
  ModelTable models_;
  LoadThread load_thread_;
};

}  // namespace warmpool::worker
