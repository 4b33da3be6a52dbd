// Simulated workers. They follow worker/worker.cc: frames are read in order by the serving
// thread, which runs infer, attach, park and unload one after another and hands loads to the load
// thread; every job holds an in-flight marker while it runs, so a worker that dies is reported
// with exactly the jobs it was running. Handles travel with frames and are looked up when the
// frame is written, as the kernel does with SCM_RIGHTS.
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "ipc/error_proto.h"
#include "ipc/file_version_proto.h"
#include "ipc/framing.h"
#include "shm/seqlock.h"
#include "sim/simulator.h"

namespace warmpool::sim {

namespace event = supervisor::event;

void Simulator::Spawn(uint32_t slot, uint32_t generation) {
  Worker& w = workers_[slot];
  if (w.state != Worker::State::kDown) return Fail(fmt::format("worker {} spawned while it runs", slot));
  w.generation = generation;
  w.pid = next_pid_++;
  w.ForgetProcess();
  w.state = Worker::State::kStarting;
  Trace(fmt::format("== worker {} starting (generation {})", slot, w.generation));
  pending_events_.push_back([this, slot, generation, pid = w.pid] {
    Deliver(event::WorkerSpawned{slot, generation, pid}, fmt::format("worker {} spawned", slot));
  });
  After(rng_.Range(2, 40), Reading([this, slot, generation] {
    Worker& w = workers_[slot];
    if (w.generation != generation || w.state != Worker::State::kStarting) return;
    w.state = Worker::State::kUp;
    Deliver(event::WorkerUp{slot, generation}, fmt::format("worker {} up", slot));
  }));
}

void Simulator::SendToWorker(uint32_t slot, std::string frame, std::vector<int> handles) {
  v1::WorkerEnvelope message;
  if (!message.ParseFromArray(frame.data() + ipc::kFramePrefixBytes,
                              static_cast<int>(frame.size() - ipc::kFramePrefixBytes))) {
    return Fail("the core sent a frame that does not parse");
  }
  Trace(fmt::format("<- worker {}: {}", slot, Brief(message)));
  for (int h : handles) {
    if (supervisor_handles_.count(h) == 0) {
      return Fail(fmt::format("handle {}, which the supervisor does not hold, was sent to worker {} ({})", h,
                              slot, Brief(message)));
    }
    if (lost_handles_.count(h) != 0) {
      return Fail(fmt::format("handle {}, device memory lost with its owner, was sent to worker {} ({})", h,
                              slot, Brief(message)));
    }
  }
  const std::string* infer_data = !message.has_infer()                ? nullptr
                                  : message.infer().inputs_size() > 0 ? &message.infer().inputs(0).data()
                                                                      : &message.infer().input().data();
  if (infer_data != nullptr && infer_data->size() >= sizeof(float)) {
    float token = 0;
    std::memcpy(&token, infer_data->data(), sizeof(float));
    auto it = token_session_.find(static_cast<uint32_t>(token));
    if (it != token_session_.end() && gone_sessions_.count(it->second) != 0) {
      return Fail(fmt::format("a request of session {}, which is gone, was sent to worker {} to run",
                              it->second, slot));
    }
  }
  if (message.has_infer() && (message.infer().has_generate() || message.infer().has_embed())) {
    const std::string& prompt = message.infer().has_generate() ? message.infer().generate().prompt()
                                                               : message.infer().embed().input(0);  // "token N"
    auto it = token_session_.find(static_cast<uint32_t>(SimPromptNumber(prompt)));
    if (it != token_session_.end() && gone_sessions_.count(it->second) != 0) {
      return Fail(fmt::format("a generation of session {}, which is gone, was sent to worker {} to run",
                              it->second, slot));
    }
  }
  if (message.has_infer() && message.infer().kv_source() && !CheckKvSource(slot, message, handles)) return;
  if (message.has_infer()) NoteInferSent(slot, message);
  Worker& w = workers_[slot];
  if (w.state != Worker::State::kUp) return;  // the shell drops frames for a worker not up
  // Written now, unless frames wait before it (a full socket buffer): then when its turn comes.
  bool waits = w.unwritten > 0 || rng_.Chance(congestion_per_mille_);
  uint64_t at = std::max(now_ + (waits ? rng_.Range(1, 30) : rng_.Range(0, 1)), w.last_delivery_ms);
  w.last_delivery_ms = at;
  uint32_t generation = w.generation;
  if (!waits) {
    WriteFrame(slot, generation, std::move(message), handles);
    return;
  }
  w.unwritten++;
  At(at, [this, slot, generation, message = std::move(message), handles = std::move(handles)]() mutable {
    Worker& w = workers_[slot];
    if (w.generation != generation) return;
    w.unwritten--;
    if (w.state != Worker::State::kUp) return;
    WriteFrame(slot, generation, std::move(message), handles);
  });
}

void Simulator::WriteFrame(uint32_t slot, uint32_t generation, v1::WorkerEnvelope message,
                           const std::vector<int>& handles) {
  for (int h : handles) {
    // A client's region, or a parked KV cache on its way to the engine that adopts it, may be let go
    // while a frame that names it waits: the shell's channel duplicated it when the frame was queued
    // (checked there, in SendToWorker), and closing it frees no memory for reuse. Weights and host
    // copies may not: the core must hold what it sends until the worker has it.
    if (supervisor_handles_.count(h) == 0 && !regions_[h].client && !regions_[h].kv_cache) {
      // The kernel refuses the frame (EBADF): the shell's channel fails and the worker is killed.
      Fail(fmt::format("handle {} was closed while a frame for worker {} still named it ({})", h,
                       slot, Brief(message)));
      return;
    }
  }
  Worker& w = workers_[slot];
  uint64_t at = std::max(now_ + rng_.Range(0, 1), w.last_delivery_ms);
  w.last_delivery_ms = at;
  std::vector<int> worker_regions;  // the worker's own descriptors for the same memory
  for (int h : handles) {
    worker_regions.push_back(next_handle_++);
    regions_[worker_regions.back()] = regions_[h];
  }
  At(at, [this, slot, generation, message = std::move(message), worker_regions]() mutable {
    WorkerReads(slot, generation, std::move(message), std::move(worker_regions));
  });
}

void Simulator::WorkerReads(uint32_t slot, uint32_t generation, v1::WorkerEnvelope message,
                            std::vector<int> regions) {
  Worker& w = workers_[slot];
  if (w.generation != generation || w.state != Worker::State::kUp) return;
  if (message.has_cancel()) {  // read between a generation's steps, whatever runs
    w.cancelled.insert(message.cancel().job());
    return;
  }
  WorkerJob work{std::move(message), regions.empty() ? -1 : regions.back(), -1, std::nullopt};
  if (!AdmitKvSequence(w, work)) return;
  if (work.message.has_attach() && work.message.attach().kv_cache() && regions.size() == 2) {
    work.region = regions[0];  // the weights, then the KV cache
    work.cache = regions[1];
  }
  w.serving.push_back(std::move(work));
  StartServing(w);
}

void Simulator::StartServing(Worker& w) {
  while (w.serving_job == 0 && !w.serving.empty()) {
    WorkerJob work = std::move(w.serving.front());
    w.serving.pop_front();
    if (work.message.has_regions_gone()) continue;  // unmapped at once; no reply
    // Read by the serving thread, run by the load thread: loads and attaches, and an unload of a
    // model with one of those still there before it (as warmpool-worker keeps a model's order).
    if (work.message.has_load() || work.message.has_attach() ||
        (work.message.has_unload() && OnLoadThread(w, work.message.unload().model()))) {
      w.loads.push_back(std::move(work));
      StartLoad(w);
      continue;
    }
    if (work.message.has_infer() && (work.message.infer().has_generate() || work.message.infer().has_embed())) {
      const uint64_t job = work.message.infer().job();  // before `work` is moved from
      StartGeneration(w, job, std::move(work));
      continue;
    }
    uint64_t job = 0;
    switch (work.message.body_case()) {
      case v1::WorkerEnvelope::kInfer: job = work.message.infer().job(); break;
      case v1::WorkerEnvelope::kUnload: job = work.message.unload().job(); break;
      case v1::WorkerEnvelope::kAttach: job = work.message.attach().job(); break;
      case v1::WorkerEnvelope::kPark: job = work.message.park().job(); break;
      default: return Fail("a worker got a frame it does not know");
    }
    w.serving_job = job;
    Schedule(w, job, /*load_thread=*/false, std::move(work));
  }
}

bool Simulator::OnLoadThread(const Worker& w, uint32_t model) const {
  auto model_of = [](const v1::WorkerEnvelope& m) {
    return m.has_load() ? m.load().model() : m.has_attach() ? m.attach().model() : m.unload().model();
  };
  if (w.load_job != 0 && w.load_model == model) return true;
  for (const WorkerJob& job : w.loads) {
    if (model_of(job.message) == model) return true;
  }
  return false;
}

void Simulator::StartLoad(Worker& w) {
  if (w.load_job != 0 || w.loads.empty()) return;
  WorkerJob work = std::move(w.loads.front());
  w.loads.pop_front();
  if (!work.message.has_load()) {
    const bool attach = work.message.has_attach();
    w.load_job = attach ? work.message.attach().job() : work.message.unload().job();
    w.load_model = attach ? work.message.attach().model() : work.message.unload().model();
    w.load_name.clear();  // not a file load
    Schedule(w, w.load_job, /*load_thread=*/true, std::move(work));
    return;
  }
  w.load_job = work.message.load().job();
  w.load_model = work.message.load().model();
  w.load_name = work.message.load().name();
  if (const SimFile* f = FileOf(work.message.load().name(), work.message.load().path());
      f != nullptr && !f->broken) {
    work.read = *f;  // the header as it is when the load begins
  }
  const std::string& name = w.load_name;
  if (++loads_running_[name] > 1) {
    return Fail(fmt::format("two file loads of \"{}\" run at once", name));
  }
  Schedule(w, w.load_job, /*load_thread=*/true, std::move(work));
}

void Simulator::Schedule(Worker& w, uint64_t job, bool load_thread, WorkerJob work) {
  uint64_t duration = load_thread ? rng_.Range(2, 60) : rng_.Range(0, 15);
  if (rng_.Chance(slow_per_mille_)) duration *= 20;
  uint32_t slot = w.slot, generation = w.generation;
  if (rng_.Chance(crash_per_mille_)) {
    // A crash in the middle of the job, its marker still taken; it strikes whichever generation of
    // the slot is up by then (a crash is a crash), so it needs no generation of its own.
    After(rng_.Range(0, duration), [this, slot] { Kill(slot, ""); });
    return;
  }
  if (rng_.Chance(hang_per_mille_)) {
    Trace(fmt::format("== worker {} hangs in job {}", slot, job));
    return;  // never finishes: the core's deadline or stall check must kill it
  }
  After(duration, [this, slot, generation, job, load_thread, work = std::move(work)]() mutable {
    FinishJob(slot, generation, job, load_thread, std::move(work));
  });
}

const SimFile* Simulator::FileOf(const std::string& name, const std::string& path) const {
  for (const SimFile& f : files_) {
    if (f.name == name || (!f.path.empty() && f.path == path)) return &f;
  }
  return nullptr;
}

int Simulator::NewSupervisorHandle(const Region& region) {
  int h = next_handle_++;  // the supervisor's descriptor once the frame carrying it is read
  regions_[h] = region;
  return h;
}

void Simulator::FinishJob(uint32_t slot, uint32_t generation, uint64_t job, bool load_thread,
                          WorkerJob work) {
  Worker& w = workers_[slot];
  if (w.generation != generation || w.state != Worker::State::kUp) return;
  if (work.message.has_load()) loads_running_[work.message.load().name()]--;
  std::vector<int> regions;
  v1::WorkerEnvelope reply = RunJob(w, work, regions);
  (load_thread ? w.load_job : w.serving_job) = 0;
  ReplyToCore(w, std::move(reply), std::move(regions));
  if (load_thread) StartLoad(w);
  else StartServing(w);
}

void Simulator::ReplyToCore(Worker& w, v1::WorkerEnvelope message, std::vector<int> regions) {
  NoteReplySent(message);
  w.to_core.push_back(Worker::ToCore{std::move(message), std::move(regions), now_});
  uint64_t at = std::max(now_ + rng_.Range(0, 2), w.last_reply_ms);
  w.last_reply_ms = at;
  uint32_t slot = w.slot, generation = w.generation;
  At(at, [this, slot, generation] { DeliverToCore(slot, generation); });
}

void Simulator::DeliverToCore(uint32_t slot, uint32_t generation) {
  if (Hold([this, slot, generation] { DeliverToCore(slot, generation); })) return;
  Worker& w = workers_[slot];
  if (w.generation != generation || w.to_core.empty()) return;
  Worker::ToCore next = std::move(w.to_core.front());
  w.to_core.pop_front();
  v1::WorkerEnvelope& message = next.message;
  std::vector<int>& handles = next.handles;
  for (int h : handles) supervisor_handles_.insert(h);
  std::string what = fmt::format("worker {}: {}", slot, Brief(message));
  Deliver(event::WorkerMessage{slot, std::move(message), std::move(handles)}, what);
}

void Simulator::Kill(uint32_t slot, const std::string& reason, bool fatal) {
  Worker& w = workers_[slot];
  if (w.state == Worker::State::kDown) return;
  if (!w.kill_reason.empty()) return;  // already dying
  w.kill_reason = reason.empty() ? "killed by signal 9 (Killed)" : reason;
  uint32_t generation = w.generation;
  std::string why = fatal ? "exited with status 2"
                    : reason.empty() ? "killed by signal 9 (Killed)"
                                     : "was killed by the supervisor: " + reason;
  // The process stops now; the kernel reports the death a moment later.
  w.state = Worker::State::kStarting;  // neither up nor down: takes no frames, runs nothing more
  w.serving.clear();
  w.loads.clear();
  After(rng_.Range(0, 3), [this, slot, generation, why, fatal] { Die(slot, generation, why, fatal); });
}

void Simulator::Die(uint32_t slot, uint32_t generation, const std::string& why, bool fatal) {
  // The kernel reports the exit through the loop: read after the pause, like the channel.
  if (Hold([this, slot, generation, why, fatal] { Die(slot, generation, why, fatal); })) return;
  Worker& w = workers_[slot];
  if (w.generation != generation || w.state == Worker::State::kDown) return;
  ForgetInfers(slot, generation);
  outcome_.worker_deaths++;
  // What it wrote before it died is read first, as the shell drains the channel at the exit.
  while (!w.to_core.empty() && !failed_) DeliverToCore(slot, generation);
  event::WorkerDown down;
  down.slot = slot;
  down.generation = generation;
  down.why = why;
  down.exit_text = why;
  down.exit_code = fatal ? 2 : why.starts_with("exited") ? 0 : 137;
  down.fatal = fatal;
  if (w.serving_job != 0) down.running_jobs.push_back(w.serving_job);
  if (w.load_job != 0) down.running_jobs.push_back(w.load_job);
  if (w.load_job != 0 && !w.load_name.empty()) loads_running_[w.load_name]--;  // its load ends with it
  w.load_job = w.serving_job = 0;
  w.state = Worker::State::kDown;
  Deliver(std::move(down), fmt::format("worker {} died: {}", slot, why));
}

}  // namespace warmpool::sim
