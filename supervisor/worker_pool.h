// The worker processes: spawn (fork+exec through uv_spawn, channel on fd 3) when the core asks,
// hello, death. Death is learnt from the kernel (the child's exit, via libuv's SIGCHLD handling)
// and from channel EOF, never by polling; EOF alone gets the process killed so that the exit
// follows at once. When to start a worker again, and what a death means for requests and models,
// is the core's business; so are the worker records in the segment.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <uv.h>

#include "common/backend.h"
#include "common/status.h"
#include "ipc/connection.h"
#include "ipc/uv_handle.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"
#include "supervisor/child_process.h"

namespace warmpool::supervisor {

struct WorkerPoolOptions {
  std::string worker_path;  // the warmpool-worker binary
  ipc::WriteBatcher* batcher = nullptr;  // channels' writes coalesced per turn of the loop
  std::string instance;
  std::string engine_dir;  // where workers may dlopen engine plugins; empty: built-ins only
  // workers_per_device workers for each device; slot s serves device s / workers_per_device
  // with that device's budget (0: unlimited).
  uint32_t workers_per_device = 2;
  std::vector<uint64_t> device_budgets = {0};
  uint32_t max_frame_bytes = 64u << 20;
  Backend backend = Backend::kHost;  // as resolved: host or cuda
  std::string sharing = "vmm";   // cuda: vmm | legacy, as the device's owner shares memory
  bool tf32 = false;             // cuda: f32 dense layers on TF32 tensor cores
  uint32_t threads = 1;          // compute threads of each worker
};

// Frames to a worker carry a few fields more than the client's request they wrap.
inline constexpr uint32_t kWorkerFrameHeadroom = 64 * 1024;

struct WorkerEvents {
  std::function<void(uint32_t slot)> on_ready;  // hello received: the worker takes jobs
  // A message that says it carries a descriptor gets it with WorkerPool::TakeFd.
  std::function<void(uint32_t slot, v1::WorkerEnvelope&& message)> on_message;
  // The process is gone (reaped), or could not be started. `why` reads like "killed by signal 9"
  // or "exited with status 1" (or the reason it was killed); exit_code is 128 + signal or the
  // status, -1 for no start; fatal: exit status 2 or no start.
  std::function<void(uint32_t slot, uint32_t generation, const std::string& why, int exit_code,
                     bool fatal)>
      on_death;
};

class WorkerPool {
 public:
  WorkerPool(uv_loop_t* loop, WorkerPoolOptions options, WorkerEvents events);
  ~WorkerPool();

  // Starts the slot's process as this generation; its pid, or -1 (on_death has been called).
  int Spawn(uint32_t slot, uint32_t generation);
  // False when the worker is not ready (the caller treats the job as lost with the worker).
  // fds go with the frame (the caller keeps its copies).
  bool SendFrame(uint32_t slot, std::string frame, const std::vector<int>& fds = {});
  // The same frame to every worker that is ready.
  void SendFrameToAll(const std::string& frame);
  // Closes every channel (workers exit on EOF), SIGKILLs stragglers after grace_ms, then calls done.
  void Shutdown(uint64_t grace_ms, std::function<void()> done);

  // SIGKILLs the worker; its death is reported with `reason` instead of the bare signal.
  void Kill(uint32_t slot, const std::string& reason);
  // Reads, without blocking, what every worker has already written to its channel, handing it to
  // on_message now. The tick calls it before the core judges workers (event::Tick): libuv runs
  // expired timers before it polls for I/O, so after the daemon was paused a worker's reply can
  // wait unread in its socket while its deadline timer fires.
  void ReadChannels();
  // The time the loop last began a poll for I/O that has since completed: everything any peer,
  // worker or client, had sent before then has been read (event::Tick::clients_read_ms).
  uint64_t polled_through_ms() const { return polled_through_ms_; }
  // The oldest descriptor received from the worker and not yet taken (caller owns it), or -1.
  int TakeFd(uint32_t slot);
  // "killed by signal 9", "exited with status 1", or "" for a worker that never died.
  std::string LastExit(uint32_t slot) const;
  uint32_t generation(uint32_t slot) const;

 private:
  struct Worker;
  void OnFrame(uint32_t slot, uint32_t generation, std::string_view body);
  void OnExit(uint32_t slot, const ChildEnd& end);
  void MaybeFinishShutdown();

  uv_loop_t* loop_;
  WorkerPoolOptions options_;
  WorkerEvents events_;
  std::vector<std::unique_ptr<Worker>> workers_;
  bool shutting_down_ = false;
  std::function<void()> shutdown_done_;
  ipc::UvHandle<uv_timer_t> kill_timer_;
  // Around the loop's poll phase: prepare runs just before it, check just after.
  ipc::UvHandle<uv_prepare_t> before_poll_;
  ipc::UvHandle<uv_check_t> after_poll_;
  uint64_t poll_began_ms_ = 0;
  uint64_t polled_through_ms_ = 0;
};

}  // namespace warmpool::supervisor
