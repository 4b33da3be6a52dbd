// The load thread's queue and loop, attach and unload. Loads are worker/load.cc.
#include "worker/load_thread.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "engines/catalog/plugin_loader.h"
#include "ipc/error_proto.h"

namespace warmpool::worker {

LoadThread::LoadThread(const WorkerOptions& options, Outbox& outbox, MemoryService& memory, InflightMarks& marks,
                       ModelTable& models)
    : options_(options), outbox_(outbox), memory_(memory), marks_(marks), models_(models) {}

LoadThread::~LoadThread() {
  Stop();
  Join();
}

void LoadThread::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void LoadThread::Stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
}

void LoadThread::Join() {
  if (thread_.joinable()) thread_.join();
  for (Job& job : queue_) {
    if (job.fd >= 0) close(job.fd);
    if (job.cache >= 0) close(job.cache);
    job.fd = job.cache = -1;
  }
}

bool LoadThread::Stopping() {
  std::lock_guard lock(mutex_);
  return stopping_;
}

void LoadThread::QueueLoad(v1::WorkerLoad request, int file) {
  const uint32_t model = request.model();
  Job job;
  job.load = std::move(request);
  job.fd = file;
  Queue(std::move(job), model);
}

void LoadThread::QueueAttach(v1::WorkerAttach request, int weights_fd, int cache_fd) {
  const uint32_t model = request.model();
  Job job;
  job.attach = std::move(request);
  job.fd = weights_fd;
  job.cache = cache_fd;
  Queue(std::move(job), model);
}

void LoadThread::Queue(Job job, uint32_t model) {
  std::lock_guard lock(mutex_);
  jobs_of_[model]++;
  queue_.push_back(std::move(job));
  cv_.notify_one();
}

void LoadThread::Unload(v1::WorkerUnload request) {
  std::unique_lock lock(mutex_);
  auto pending = jobs_of_.find(request.model());
  if (pending == jobs_of_.end()) {
    // Nothing of the model here, and only the caller (the serving thread) queues: nothing can
    // come before it once the lock is let go.
    lock.unlock();
    RunUnload(request, /*on_load_thread=*/false);
    return;
  }
  pending->second++;
  Job job;
  job.unload = std::move(request);
  queue_.push_back(std::move(job));
  cv_.notify_one();
}

void LoadThread::JobDone(uint32_t model) {
  std::lock_guard lock(mutex_);
  auto it = jobs_of_.find(model);
  if (it != jobs_of_.end() && --it->second == 0) jobs_of_.erase(it);
}

void LoadThread::Loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const uint64_t id = job.load ? job.load->job() : job.attach ? job.attach->job() : 0;
    memory_.SetLoadThreadJob(id);
    if (job.load) RunLoad(*job.load, job.fd);
    else if (job.attach) {
      Attach(*job.attach, job.fd, job.cache);
      if (job.cache >= 0) close(job.cache);  // an engine that adopted it keeps a descriptor of its own
    }
    else RunUnload(*job.unload, /*on_load_thread=*/true);
    memory_.SetLoadThreadJob(0);
    if (id != 0) memory_.DropOffer(id);
  }
}

void LoadThread::RunUnload(const v1::WorkerUnload& request, bool on_load_thread) {
  std::optional<JobMark> mark(std::in_place, marks_, request.job(), request.model());
  std::shared_ptr<Engine> engine = models_.Take(request.model());
  outbox_.FaultsFor(request.job(), request.faults()).Hit("unload.mid");
  engine.reset();  // closes the engine (unless a job still uses it): its regions go back to the memory service
  mark.reset();
  v1::WorkerEnvelope reply;
  reply.mutable_unload_done()->set_job(request.job());
  if (on_load_thread) JobDone(request.model());
  outbox_.Send(reply);
}

// A parked model's KV cache (WorkerAttach.kv_cache) as its unparked engine's own. An engine that
// cannot take it starts with an empty cache: a cold prefix cache costs time, never a wrong token.
void LoadThread::AdoptCache(Engine& engine, const v1::WorkerAttach& request, int cache_fd) {
  if (cache_fd < 0) return;
  struct stat st{};
  Status status = fstat(cache_fd, &st) == 0
                      ? engine.AdoptCache(cache_fd, static_cast<uint64_t>(st.st_size))
                      : Error(Code::kInvalidArgument, "cannot read the KV cache region's size: {}", std::strerror(errno));
  if (!status.ok()) {
    spdlog::warn("worker {}: \"{}\" starts with an empty KV cache, not its parked one: {}", options_.slot,
                 request.name(), status.message());
  }
}

void LoadThread::Attach(const v1::WorkerAttach& request, int weights_fd, int cache_fd) {
  std::optional<JobMark> mark(std::in_place, marks_, request.job(), request.model());
  v1::WorkerEnvelope reply;
  v1::WorkerLoadDone* done = reply.mutable_load_done();
  done->set_job(request.job());
  JobFaults faults = outbox_.FaultsFor(request.job(), request.faults());
  const wp_device_memory& memory = *memory_.engines();
  Status status;
  Result<const wp_engine_vtable*> vtable = ResolveEngine(request.engine(), options_.engine_dir);
  const v1::ModelWeights& described = request.weights();
  const std::string& header = described.header();
  wp_engine_spec spec = SpecForFile(request.name().c_str(), request.path().c_str(),
                      reinterpret_cast<const uint8_t*>(header.data()), header.size(),
                      described.file_size());
  spec.sequences = described.sequences();  // as many as the load that described them ran
  spec.kv_tokens = described.kv_tokens();     // in a cache as large
  spec.prefill_stretch = described.prefill_stretch();
  if (!vtable.ok()) {
    status = vtable.status();
  } else {
    Result<Engine> engine = Engine::Open(*vtable, spec, &memory);
    if (!engine.ok()) {
      status = engine.status();
    } else {
      wp_region region{nullptr, 0, -1};
      if (described.weight_bytes() > 0) {
        if (weights_fd < 0) {
          status = Error(Code::kInternal, "attach of \"{}\" came without its weights", request.name());
        } else if (request.copy()) {
          Result<wp_region> copied = memory_.CopyToDevice(weights_fd, described.weight_bytes());
          if (copied.ok()) region = *copied;
          else status = copied.status();
        } else if (memory.import(memory.ctx, weights_fd, described.weight_bytes(), &region) != WP_OK) {
          status = Error(Code::kInternal, "cannot map the shared weights of \"{}\"", request.name());
        }
      }
      if (status.ok()) {
        faults.Hit("attach.mid");  // weights mapped, engine not yet serving
        status = engine->Attach(region);
        if (!status.ok() && region.ptr != nullptr) memory.free(memory.ctx, &region);
      }
      std::vector<int> shared;
      if (status.ok()) {
        *done->mutable_weights() = described;  // what it was told the weights are,
        DescribeEngine(*engine, done->mutable_weights());  // as its engine measures them
        AdoptCache(*engine, request, cache_fd);
        // Unparked weights live in a new device region: the supervisor holds that one now.
        if (request.copy() && region.handle >= 0) {
          shared.push_back(region.handle);
          done->set_weights_shared(true);
          done->set_grant(memory_.GrantOf(region));
          memory_.KeepMappingOf(region.handle);
        }
        ShareCache(*engine, memory_, *done, shared);
        models_.Put(request.model(), std::move(*engine));
      }
      if (weights_fd >= 0) close(weights_fd);  // the import made its own copy
      if (!status.ok()) ipc::SetError(done->mutable_error(), status);
      mark.reset();
      JobDone(request.model());
      outbox_.Send(reply, shared);
      return;
    }
  }
  if (weights_fd >= 0) close(weights_fd);
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  mark.reset();
  JobDone(request.model());
  outbox_.Send(reply);
}

}  // namespace warmpool::worker
