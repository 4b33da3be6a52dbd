#include "supervisor/worker_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "ipc/exit_status.h"
#include "ipc/framing.h"
#include "supervisor/child_process.h"

namespace warmpool::supervisor {

struct WorkerPool::Worker {
  uint32_t slot = 0;
  uint32_t generation = 0;
  int pid = 0;
  bool ready = false;      // hello received
  bool running = false;    // spawned and not yet reaped
  std::string last_exit_text;
  std::string kill_reason;     // set when the supervisor killed it on purpose
  ipc::Connection* channel = nullptr;
  std::unique_ptr<ipc::UvHandle<uv_process_t>> process;
  WorkerPool* pool = nullptr;
};

WorkerPool::WorkerPool(uv_loop_t* loop, WorkerPoolOptions options, WorkerEvents events)
    : loop_(loop), options_(std::move(options)), events_(std::move(events)) {
  for (uint32_t i = 0; i < options_.workers_per_device * options_.device_budgets.size(); i++) {
    auto w = std::make_unique<Worker>();
    w->slot = i;
    w->pool = this;
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

WorkerPool::~WorkerPool() {
  for (auto& w : workers_) {
    if (w->channel != nullptr) w->channel->Close(OkStatus());
    if (w->running && w->pid > 0) kill(w->pid, SIGKILL);
  }
}

int WorkerPool::Spawn(uint32_t slot, uint32_t generation) {
  Worker& w = *workers_[slot];
  if (shutting_down_ || w.running) return -1;
  w.generation = generation;
  // A worker that cannot start is reported like one that died: fatal (never respawned) only when
  // trying again cannot help, the binary missing or not executable; out of descriptors, processes
  // or memory it is respawned with the usual backoff.
  auto refuse = [&](const std::string& why, bool fatal) {
    if (fatal) {
      spdlog::critical("cannot start worker {} ({}): {}; not retrying", slot, options_.worker_path, why);
    } else {
      spdlog::error("cannot start worker {}: {}; retrying", slot, why);
    }
    if (events_.on_death) events_.on_death(slot, generation, "could not be started: " + why, -1, fatal);
    return -1;
  };
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return refuse(std::string("socketpair: ") + std::strerror(errno), /*fatal=*/false);
  }
  const uint32_t device = slot / options_.workers_per_device;
  std::vector<std::string> args = {
      options_.worker_path,
      "--channel-fd", "3",
      "--slot", std::to_string(slot),
      "--generation", std::to_string(generation),
      "--device", std::to_string(device),
      "--instance", options_.instance,
      "--budget", std::to_string(options_.device_budgets[device]),
      "--max-frame-bytes", std::to_string(options_.max_frame_bytes + kWorkerFrameHeadroom),
      "--parent", std::to_string(getpid()),
      "--engine-dir", options_.engine_dir,
      "--backend", options_.backend,
      "--sharing", options_.sharing,
      "--threads", std::to_string(options_.threads),
  };
  if (options_.tf32) args.push_back("--tf32");
  w.process = std::make_unique<ipc::UvHandle<uv_process_t>>();
  w.process->get()->data = &w;
  int rc = SpawnChild(loop_, w.process->get(), args, fds[1], [](uv_process_t* process, int64_t exit_status,
                                                               int term_signal) {
    auto* worker = static_cast<Worker*>(process->data);
    worker->pool->OnExit(worker->slot, exit_status, term_signal);
  });
  close(fds[1]);
  if (rc != 0) {
    // uv_spawn initialises the handle even on failure; it must still be closed.
    w.process->MarkInitialized();
    w.process.reset();
    close(fds[0]);
    bool hopeless = rc == UV_ENOENT || rc == UV_EACCES || rc == UV_ENOTDIR || rc == UV_ELOOP;
    return refuse(uv_strerror(rc), hopeless);
  }
  w.process->MarkInitialized();
  w.pid = w.process->get()->pid;
  w.running = true;
  w.kill_reason.clear();
  w.ready = false;

  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  ipc::Connection::Options channel_options;
  channel_options.max_frame_bytes = options_.max_frame_bytes + kWorkerFrameHeadroom;
  // Work for a worker is bounded by the core (its window), never by dropping it here.
  channel_options.max_pending_write_bytes = SIZE_MAX;
  channel_options.accept_fds = true;  // weights regions
  channel_options.batcher = options_.batcher;
  w.channel = ipc::Connection::Open(
      loop_, fds[0], channel_options,
      [this, slot, generation](std::string_view body) {
        Worker& worker = *workers_[slot];
        if (worker.generation != generation) return;
        v1::WorkerEnvelope message;
        if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
          spdlog::error("worker {} sent a malformed message; stopping it", slot);
          if (worker.pid > 0) kill(worker.pid, SIGKILL);
          return;
        }
        if (message.has_hello()) {
          if (message.hello().generation() != generation || message.hello().slot() != slot) {
            spdlog::error("worker {} introduced itself as slot {} generation {}; stopping it", slot,
                          message.hello().slot(), message.hello().generation());
            kill(worker.pid, SIGKILL);
            return;
          }
          worker.ready = true;
          if (events_.on_ready) events_.on_ready(slot);
          return;
        }
        if (events_.on_message) events_.on_message(slot, std::move(message));
      },
      [this, slot, generation](const Status& why) {
        Worker& worker = *workers_[slot];
        if (worker.generation != generation) return;
        if (!shutting_down_ && worker.running) {
          spdlog::warn("worker {} channel closed ({}); stopping the worker", slot, why.ToString());
        }
        worker.channel = nullptr;
        worker.ready = false;
        // EOF with the process still there (it closed fd 3, or is wedged): make the exit certain.
        if (worker.running && worker.pid > 0 && !shutting_down_) kill(worker.pid, SIGKILL);
      });
  return w.pid;
}

void WorkerPool::OnExit(uint32_t slot, int64_t exit_status, int term_signal) {
  Worker& w = *workers_[slot];
  std::string why = term_signal != 0 ? fmt::format("killed by signal {} ({})", term_signal, strsignal(term_signal))
                                     : fmt::format("exited with status {}", exit_status);
  w.last_exit_text = why;
  if (!w.kill_reason.empty()) why = fmt::format("was killed by the supervisor: {}", w.kill_reason);
  w.running = false;
  w.ready = false;
  int exit_code = term_signal != 0 ? 128 + term_signal : static_cast<int32_t>(exit_status);
  // The exit can be reported before the channel was read: take what the worker said before it
  // died (finished replies, a fault's firing) so that nothing it completed is lost or redone.
  if (w.channel != nullptr) w.channel->Drain();
  if (w.channel != nullptr) {
    ipc::Connection* channel = w.channel;
    w.channel = nullptr;
    channel->Close(OkStatus());
  }
  w.process.reset();
  const bool fatal = ipc::IsFatalExit(exit_status, term_signal);
  if (events_.on_death) events_.on_death(slot, w.generation, why, exit_code, fatal);
  if (shutting_down_) MaybeFinishShutdown();
}

bool WorkerPool::SendFrame(uint32_t slot, std::string frame, const std::vector<int>& fds) {
  Worker& w = *workers_[slot];
  if (!w.ready || w.channel == nullptr) return false;
  w.channel->Send(std::move(frame), fds);
  return true;
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
    for (size_t i = 0; i < rounds; i++) {
      ipc::Connection* channel = workers_[slot]->channel;  // a message handled may close it
      if (channel == nullptr || channel->closing()) break;
      pollfd p{channel->fd(), POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) break;
      channel->Drain();
    }
  }
}

int WorkerPool::TakeFd(uint32_t slot) {
  Worker& w = *workers_[slot];
  return w.channel != nullptr ? w.channel->TakeFd() : -1;
}

void WorkerPool::Kill(uint32_t slot, const std::string& reason) {
  Worker& w = *workers_[slot];
  if (!w.running || w.pid <= 0 || !w.kill_reason.empty()) return;
  w.kill_reason = reason.empty() ? "asked to" : reason;
  kill(w.pid, SIGKILL);
}

std::string WorkerPool::LastExit(uint32_t slot) const { return workers_[slot]->last_exit_text; }
uint32_t WorkerPool::generation(uint32_t slot) const { return workers_[slot]->generation; }

void WorkerPool::Shutdown(uint64_t grace_ms, std::function<void()> done) {
  shutting_down_ = true;
  shutdown_done_ = std::move(done);
  for (auto& w : workers_) {
    if (w->channel != nullptr) {
      ipc::Connection* channel = w->channel;
      w->channel = nullptr;
      channel->Close(OkStatus());  // EOF: an idle worker exits on its own
    }
    // The drain is over: whatever a worker still does is abandoned. TERM now, KILL at grace_ms.
    if (w->running && w->pid > 0) kill(w->pid, SIGTERM);
  }
  uv_timer_start(kill_timer_.get(), [](uv_timer_t* t) {
    auto* pool = static_cast<WorkerPool*>(t->data);
    for (auto& w : pool->workers_) {
      if (w->running && w->pid > 0) {
        spdlog::warn("worker {} (pid {}) did not exit in time; killing it", w->slot, w->pid);
        kill(w->pid, SIGKILL);
      }
    }
  }, grace_ms, 0);
  MaybeFinishShutdown();
}

void WorkerPool::MaybeFinishShutdown() {
  if (!shutting_down_ || !shutdown_done_) return;
  for (auto& w : workers_) {
    if (w->running) return;
  }
  uv_timer_stop(kill_timer_.get());
  auto done = std::move(shutdown_done_);
  shutdown_done_ = nullptr;
  done();
}

}  // namespace warmpool::supervisor
