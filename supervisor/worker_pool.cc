#include "supervisor/worker_pool.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "ipc/child_arguments.h"
#include "ipc/framing.h"
#include "supervisor/child_process.h"

namespace warmpool::supervisor {

struct WorkerPool::Worker {
  explicit Worker(uv_loop_t* loop) : child(loop) {}
  uint32_t slot = 0;
  uint32_t generation = 0;
  bool ready = false;  // hello received
  std::string last_exit_text;
  ChildWithChannel child;
};

WorkerPool::WorkerPool(uv_loop_t* loop, WorkerPoolOptions options, WorkerEvents events)
    : loop_(loop), options_(std::move(options)), events_(std::move(events)) {
  for (uint32_t i = 0; i < options_.workers_per_device * options_.device_budgets.size(); i++) {
    auto w = std::make_unique<Worker>(loop_);
    w->slot = i;
    workers_.push_back(std::move(w));
  }
  uv_timer_init(loop_, kill_timer_.get());
  kill_timer_.MarkInitialized();
  kill_timer_.get()->data = this;
  // Stamps of the poll phase for polled_through_ms(); unreferenced: they keep no loop alive.
  poll_began_ms_ = polled_through_ms_ = MonotonicMillis();
  uv_prepare_init(loop_, before_poll_.get());
  before_poll_.MarkInitialized();
  before_poll_.get()->data = this;
  uv_prepare_start(before_poll_.get(), [](uv_prepare_t* h) {
    static_cast<WorkerPool*>(h->data)->poll_began_ms_ = MonotonicMillis();
  });
  uv_unref(reinterpret_cast<uv_handle_t*>(before_poll_.get()));
  uv_check_init(loop_, after_poll_.get());
  after_poll_.MarkInitialized();
  after_poll_.get()->data = this;
  uv_check_start(after_poll_.get(), [](uv_check_t* h) {
    auto* pool = static_cast<WorkerPool*>(h->data);
    pool->polled_through_ms_ = pool->poll_began_ms_;
  });
  uv_unref(reinterpret_cast<uv_handle_t*>(after_poll_.get()));
}

WorkerPool::~WorkerPool() = default;  // each ChildWithChannel closes its channel and kills its child

int WorkerPool::Spawn(uint32_t slot, uint32_t generation) {
  Worker& w = *workers_[slot];
  if (shutting_down_ || w.child.running()) return -1;
  w.generation = generation;
  const uint32_t device = slot / options_.workers_per_device;
  ipc::WorkerArguments arguments;
  arguments.slot = slot;
  arguments.generation = generation;
  arguments.device = device;
  arguments.instance = options_.instance;
  arguments.budget_bytes = options_.device_budgets[device];
  arguments.max_frame_bytes = options_.max_frame_bytes + kWorkerFrameHeadroom;
  arguments.parent = getpid();
  arguments.engine_dir = options_.engine_dir;
  arguments.backend = options_.backend;
  arguments.sharing = options_.sharing;
  arguments.threads = options_.threads;
  arguments.tf32 = options_.tf32;
  const std::vector<std::string> args = ipc::WorkerCommandLine(options_.worker_path, arguments);
  ipc::Connection::Options channel;
  channel.max_frame_bytes = options_.max_frame_bytes + kWorkerFrameHeadroom;
  // Work for a worker is bounded by the core (its window), never by dropping it here.
  channel.max_pending_write_bytes = SIZE_MAX;
  channel.accept_fds = true;  // weights regions
  channel.batcher = options_.batcher;
  ChildWithChannel::Callbacks callbacks;
  callbacks.on_frame = [this, slot, generation](std::string_view body) { OnFrame(slot, generation, body); };
  callbacks.on_channel_lost = [this, slot](const Status& why) {
    if (!shutting_down_) spdlog::warn("worker {} channel closed ({}); stopping the worker", slot, why.ToString());
  };
  callbacks.on_exit = [this, slot](const ChildEnd& end) { OnExit(slot, end); };
  w.ready = false;
  if (std::optional<StartFailure> failed = w.child.Start(args, channel, std::move(callbacks))) {
    // A worker that cannot start is reported like one that died: fatal (never respawned) only when
    // trying again cannot help, the binary missing or not executable; out of descriptors, processes
    // or memory it is respawned with the usual backoff.
    if (failed->hopeless) {
      spdlog::critical("cannot start worker {} ({}): {}; not retrying", slot, options_.worker_path, failed->why);
    } else {
      spdlog::error("cannot start worker {}: {}; retrying", slot, failed->why);
    }
    if (events_.on_death) events_.on_death(slot, generation, "could not be started: " + failed->why, -1, failed->hopeless);
    return -1;
  }
  return w.child.pid();
}

void WorkerPool::OnFrame(uint32_t slot, uint32_t generation, std::string_view body) {
  Worker& worker = *workers_[slot];
  if (worker.generation != generation) return;
  v1::WorkerEnvelope message;
  if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    spdlog::error("worker {} sent a malformed message; stopping it", slot);
    worker.child.Kill("it sent a malformed message");
    return;
  }
  if (message.has_hello()) {
    if (message.hello().generation() != generation || message.hello().slot() != slot) {
      spdlog::error("worker {} introduced itself as slot {} generation {}; stopping it", slot,
                    message.hello().slot(), message.hello().generation());
      worker.child.Kill("it introduced itself as another worker");
      return;
    }
    worker.ready = true;
    if (events_.on_ready) events_.on_ready(slot);
    return;
  }
  if (events_.on_message) events_.on_message(slot, std::move(message));
}

void WorkerPool::OnExit(uint32_t slot, const ChildEnd& end) {
  Worker& w = *workers_[slot];
  w.last_exit_text = end.plain;
  w.ready = false;
  if (events_.on_death) events_.on_death(slot, w.generation, end.why, end.exit_code, end.fatal);
  if (shutting_down_) MaybeFinishShutdown();
}

bool WorkerPool::SendFrame(uint32_t slot, std::string frame, const std::vector<int>& fds) {
  Worker& w = *workers_[slot];
  return w.ready && w.child.Send(std::move(frame), fds);
}


void WorkerPool::SendFrameToAll(const std::string& frame) {
  for (uint32_t slot = 0; slot < workers_.size(); ++slot) SendFrame(slot, frame);
}

void WorkerPool::ReadChannels() {
  // Connection::Drain reads a bounded amount at a time (one busy peer must not starve the loop);
  // here reading goes on while the socket has more, so that a reply larger than one round is
  // whole before its worker is judged. At most about a frame: a worker that never stops writing
  // is read by the loop, not here.
  const size_t rounds = (options_.max_frame_bytes + kWorkerFrameHeadroom) / (1u << 20) + 2;
  for (uint32_t slot = 0; slot < workers_.size(); ++slot) {
    // A message handled may close the channel: DrainIfReadable looks again every round.
    for (size_t i = 0; i < rounds && workers_[slot]->child.DrainIfReadable(); i++) {
    }
  }
}

int WorkerPool::TakeFd(uint32_t slot) {
  return workers_[slot]->child.TakeFd();
}

void WorkerPool::Kill(uint32_t slot, const std::string& reason) {
  workers_[slot]->child.Kill(reason);
}

std::string WorkerPool::LastExit(uint32_t slot) const { return workers_[slot]->last_exit_text; }
uint32_t WorkerPool::generation(uint32_t slot) const { return workers_[slot]->generation; }

void WorkerPool::Shutdown(uint64_t grace_ms, std::function<void()> done) {
  shutting_down_ = true;
  shutdown_done_ = std::move(done);
  for (auto& w : workers_) {
    w->child.CloseChannel();  // EOF: an idle worker exits on its own
    // The drain is over: whatever a worker still does is abandoned. TERM now, KILL at grace_ms.
    w->child.Terminate();
  }
  uv_timer_start(kill_timer_.get(), [](uv_timer_t* t) {
    auto* pool = static_cast<WorkerPool*>(t->data);
    for (auto& w : pool->workers_) {
      if (w->child.running()) {
        spdlog::warn("worker {} (pid {}) did not exit in time; killing it", w->slot, w->child.pid());
        w->child.Kill("it did not exit in time at shutdown");
      }
    }
  }, grace_ms, 0);
  MaybeFinishShutdown();
}

void WorkerPool::MaybeFinishShutdown() {
  if (!shutting_down_ || !shutdown_done_) return;
  for (auto& w : workers_) {
    if (w->child.running()) return;
  }
  uv_timer_stop(kill_timer_.get());
  auto done = std::move(shutdown_done_);
  shutdown_done_ = nullptr;
  done();
}

}  // namespace warmpool::supervisor
