#include "worker/worker.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/chunks.h"
#include "engines/plugin_loader.h"
#include "engines/safetensors.h"
#include "ipc/descriptors.h"
#include "ipc/error_proto.h"
#include "ipc/exit_status.h"

namespace warmpool::worker {

Worker::Worker(WorkerOptions options)
    : options_(options),
      channel_(options.channel_fd, options.max_frame_bytes),
      host_memory_(options.backend == "host" ? options.budget_bytes : 0),
      device_(host_memory_.service()),
      memory_service_{this, &Worker::AllocWithFaults, &Worker::FreeRegion, 1, &Worker::ImportRegion,
                      &Worker::WriteRegion, &Worker::ReadRegion} {}

wp_status Worker::ImportRegion(void* ctx, int handle, uint64_t bytes, wp_region* out) {
  const wp_device_memory* device = static_cast<Worker*>(ctx)->device_;
  return device->import(device->ctx, handle, bytes, out);
}

wp_status Worker::AllocWithFaults(void* ctx, uint64_t bytes, wp_region* out) {
  auto* self = static_cast<Worker*>(ctx);
  wp_status status = WP_INTERNAL;
  const int offered = self->TakeOffer(self->load_thread_job_.load());
  if (offered >= 0) {
    Result<HostRegion> reused = self->host_memory_.AllocateReusing(offered, bytes);
    if (reused.ok()) {
      *out = wp_region{reused->ptr, reused->bytes, reused->fd};
      status = WP_OK;
    } else {
      spdlog::warn("worker {}: cannot reuse the memory offered: {}; allocating afresh", self->options_.slot,
                   reused.status().ToString());
    }
  }
  if (status != WP_OK) status = self->device_->alloc(self->device_->ctx, bytes, out);
  if (status == WP_OK && self->load_faults_ != nullptr) self->load_faults_->Hit("load.after_alloc");
  return status;
}

wp_status Worker::WriteRegion(void* ctx, const wp_region* region, uint64_t offset, const void* source,
                              uint64_t bytes) {
  const wp_device_memory* device = static_cast<Worker*>(ctx)->device_;
  return device->write(device->ctx, region, offset, source, bytes);
}

wp_status Worker::ReadRegion(void* ctx, const wp_region* region, uint64_t offset, void* destination,
                             uint64_t bytes) {
  const wp_device_memory* device = static_cast<Worker*>(ctx)->device_;
  return device->read(device->ctx, region, offset, destination, bytes);
}

uint64_t Worker::GrantOf(const wp_region& region) const {
#ifdef WARMPOOL_HAVE_CUDA
  if (cuda_memory_ != nullptr) return cuda_memory_->GrantOf(region);
#endif
  return 0;
}

Status Worker::OpenDeviceMemory() {
  if (options_.backend == "host") return OkStatus();
#ifdef WARMPOOL_HAVE_CUDA
  if (options_.backend == "cuda") {
    const CudaSharing sharing = options_.sharing == "legacy" ? CudaSharing::kLegacy : CudaSharing::kVmm;
    Result<std::unique_ptr<CudaMemory>> opened = CudaMemory::Open(
        static_cast<int>(options_.device), sharing,
        [this](uint64_t bytes) -> Result<OwnerGrant> {
          OwnerGrantReply reply = RequestGrant(bytes);
          if (!reply.status.ok()) return reply.status;
          return OwnerGrant{reply.grant, reply.fd, reply.bytes};
        },
        [this](uint64_t grant) {
          v1::WorkerEnvelope freed;
          freed.mutable_free()->set_grant(grant);
          Send(freed);
        });
    if (!opened.ok()) return opened.status();
    cuda_memory_ = std::move(*opened);
    device_ = cuda_memory_->service();
    memory_service_.host_addressable = device_->host_addressable;
    return OkStatus();
  }
#endif
  return Error(Code::kInvalidArgument, "backend \"{}\" is not built into this worker", options_.backend);
}

OwnerGrantReply Worker::RequestGrant(uint64_t bytes) {
  if (std::this_thread::get_id() == reader_thread_) {
    // The grant would arrive on the channel this thread reads: it would wait for itself.
    return OwnerGrantReply{Error(Code::kFailedPrecondition,
                                 "device memory can be allocated only while loading (an engine asked for "
                                 "it while serving)")};
  }
  uint64_t request = 0;
  {
    std::lock_guard lock(grant_mutex_);
    request = next_grant_request_++;
  }
  v1::WorkerEnvelope ask;
  ask.mutable_allocate()->set_request(request);
  ask.mutable_allocate()->set_bytes(bytes);
  Send(ask);
  std::unique_lock lock(grant_mutex_);
  grant_cv_.wait(lock, [&] { return grants_closed_ || grants_.count(request) != 0; });
  auto it = grants_.find(request);
  if (it == grants_.end()) {
    return OwnerGrantReply{Error(Code::kUnavailable, "the supervisor went away before granting device memory")};
  }
  OwnerGrantReply reply = std::move(it->second);
  grants_.erase(it);
  return reply;
}

void Worker::OnGrant(const v1::WorkerAllocated& reply, int fd) {
  OwnerGrantReply grant;
  if (reply.has_error()) {
    grant.status = ipc::StatusFromError(reply.error());
  } else if (fd < 0) {
    grant.status = Error(Code::kInternal, "device memory was granted without its descriptor");
  }
  grant.grant = reply.grant();
  grant.fd = fd;
  grant.bytes = reply.bytes();
  std::lock_guard lock(grant_mutex_);
  grants_[reply.request()] = std::move(grant);
  grant_cv_.notify_all();
}

JobFaults Worker::FaultsFor(uint64_t job,
                            const google::protobuf::RepeatedPtrField<v1::Fault>& faults) {
  if (faults.empty()) return JobFaults();
  return JobFaults(faults, [this, job](uint64_t id) {
    // Written before the action runs, so the supervisor reads it even if we die right after.
    v1::WorkerEnvelope fired;
    fired.mutable_fault_fired()->set_id(id);
    fired.mutable_fault_fired()->set_job(job);
    Send(fired);
  });
}

void Worker::KeepMappingOf(int fd) {
  // Host backend only: there the weights are this process's memfd mappings (devmem/host_memory.h).
  if (options_.backend == "host") host_memory_.KeepMappingOf(fd);
}

void Worker::FreeRegion(void* ctx, wp_region* region) {
  const wp_device_memory* device = static_cast<Worker*>(ctx)->device_;
  device->free(device->ctx, region);
}

Worker::~Worker() {
  {
    std::lock_guard lock(load_mutex_);
    stopping_ = true;
  }
  load_cv_.notify_all();
  {
    // A load waiting for device memory will get none now.
    std::lock_guard lock(grant_mutex_);
    grants_closed_ = true;
  }
  grant_cv_.notify_all();
  if (load_thread_.joinable()) load_thread_.join();
  for (LoadJob& job : load_queue_) {
    if (job.fd >= 0) close(job.fd);
  }
  for (auto& [request, grant] : grants_) {
    if (grant.fd >= 0) close(grant.fd);
  }
}

Status Worker::Start() {
  Result<shm::SharedSegment> segment = shm::SharedSegment::Open(options_.instance, false);
  if (!segment.ok()) return segment.status();
  segment_ = std::move(*segment);
  if (Status s = OpenDeviceMemory(); !s.ok()) return s;
  inflight_ = std::make_unique<shm::InflightTable>(segment_.view());
  if (options_.slot >= segment_.view().max_workers()) {
    return Error(Code::kInvalidArgument, "worker slot {} is outside the segment's {} slots",
                 options_.slot, segment_.view().max_workers());
  }
  v1::WorkerEnvelope hello;
  hello.mutable_hello()->set_slot(options_.slot);
  hello.mutable_hello()->set_generation(options_.generation);
  hello.mutable_hello()->set_pid(getpid());
  hello.mutable_hello()->set_backend(options_.backend);
  if (Status s = channel_.Write(hello); !s.ok()) return s;
  load_thread_ = std::thread([this] { LoadLoop(); });
  return OkStatus();
}

Status Worker::ReadIncoming(Incoming& in) {
  in.fd = -1;
  Status s = channel_.Read(in.message);
  if (!s.ok()) return s;
  // ipc/descriptors.h says which messages carry descriptors: exactly that many queued are this one's.
  const v1::WorkerEnvelope& m = in.message;
  if (m.has_infer()) {  // a client's region memfds, input's first
    in.regions = RegionFds{};
    if (m.infer().has_input_region()) in.regions.input = channel_.TakeFd();
    if (m.infer().has_output_region()) in.regions.output = channel_.TakeFd();
  } else if (ipc::DescriptorsCarried(m) > 0) {
    in.fd = channel_.TakeFd();
  }
  return OkStatus();
}

int Worker::Run() {
  reader_thread_ = std::this_thread::get_id();
  std::optional<Incoming> ahead;  // read while gathering a batch, not part of it: handled next
  Status read_error;              // met while gathering: reported once the batch is answered
  for (;;) {
    Incoming in;
    Status s = read_error;
    if (ahead) {
      in = std::move(*ahead);
      ahead.reset();
    } else if (s.ok()) {
      s = ReadIncoming(in);
    }
    if (!s.ok()) {
      if (s.code() == Code::kUnavailable) return ipc::kChildStopped;  // supervisor closed the channel
      spdlog::error("worker {}: bad message from the supervisor: {}", options_.slot, s.ToString());
      return ipc::kChildFailed;
    }
    v1::WorkerEnvelope& message = in.message;
    const int weights_fd = in.fd;
    switch (message.body_case()) {
      case v1::WorkerEnvelope::kInfer: {
        const v1::WorkerInfer& infer = message.infer();
        if (infer.has_input_region() || infer.has_output_region()) {  // never batched
          HandleInfer(infer, in.regions);
          break;
        }
        std::vector<v1::WorkerInfer> batch;
        batch.push_back(std::move(*message.mutable_infer()));
        read_error = GatherBatch(batch, ahead);
        HandleInfers(batch);
        break;
      }
      case v1::WorkerEnvelope::kUnload: {
        std::unique_lock lock(load_mutex_);
        auto pending = load_thread_jobs_.find(message.unload().model());
        if (pending == load_thread_jobs_.end()) {
          lock.unlock();
          HandleUnload(message.unload(), /*on_load_thread=*/false);
          break;
        }
        pending->second++;
        LoadJob job;
        job.unload = std::move(*message.mutable_unload());
        load_queue_.push_back(std::move(job));
        load_cv_.notify_one();
        break;
      }
      case v1::WorkerEnvelope::kPark: HandlePark(message.park()); break;
      case v1::WorkerEnvelope::kRegionsGone:
        for (uint64_t id : message.regions_gone().regions()) regions_.Forget(id);
        break;
      case v1::WorkerEnvelope::kMappingsGone:
        host_memory_.ForgetMappings({message.mappings_gone().inodes().begin(), message.mappings_gone().inodes().end()});
        break;
      case v1::WorkerEnvelope::kAllocated: OnGrant(message.allocated(), weights_fd); break;
      case v1::WorkerEnvelope::kOffer:
        if (weights_fd >= 0) StoreOffer(message.offer().job(), weights_fd);
        break;
      case v1::WorkerEnvelope::kLoad:
      case v1::WorkerEnvelope::kAttach: {
        LoadJob job;
        if (message.has_load()) job.load = std::move(*message.mutable_load());
        else job.attach = std::move(*message.mutable_attach());
        job.fd = weights_fd;
        std::lock_guard lock(load_mutex_);
        load_thread_jobs_[job.load ? job.load->model() : job.attach->model()]++;
        load_queue_.push_back(std::move(job));
        load_cv_.notify_one();
        break;
      }
      default:
        spdlog::error("worker {}: unexpected message {} from the supervisor", options_.slot,
                      static_cast<int>(message.body_case()));
        return ipc::kChildFailed;
    }
  }
}

void Worker::Send(const v1::WorkerEnvelope& message, const std::vector<int>& fds) {
  if (Status s = channel_.Write(message, fds); !s.ok()) {
    // The supervisor is gone; PR_SET_PDEATHSIG or the next read ends this process.
    spdlog::debug("worker {}: reply dropped: {}", options_.slot, s.ToString());
  }
}

Worker::JobMark::JobMark(Worker& worker, uint64_t job, uint32_t model)
    : worker_(worker),
      slot_(worker.inflight_->Take(worker.options_.generation, worker.options_.slot, job, model,
                                   UnixNanos(), worker.options_.slot * 16)) {}

Worker::JobMark::~JobMark() {
  if (slot_.ok()) worker_.inflight_->Release(*slot_, worker_.options_.generation, worker_.options_.slot);
}

void Worker::StoreOffer(uint64_t job, int fd) {
  std::lock_guard lock(offers_mutex_);
  if (auto it = offers_.find(job); it != offers_.end()) {
    close(it->second);
    it->second = fd;
    return;
  }
  // The oldest offers are for the jobs that run next: a surplus one is the newest, let go.
  if (offers_.size() >= kMaxOffers) {
    close(fd);
    return;
  }
  offers_[job] = fd;
}

int Worker::TakeOffer(uint64_t job) {
  if (job == 0) return -1;
  std::lock_guard lock(offers_mutex_);
  auto it = offers_.find(job);
  if (it == offers_.end()) return -1;
  const int fd = it->second;
  offers_.erase(it);
  return fd;
}

void Worker::DropOffer(uint64_t job) {
  const int fd = TakeOffer(job);
  if (fd >= 0) close(fd);
}

void Worker::LoadThreadJobDone(uint32_t model) {
  std::lock_guard lock(load_mutex_);
  auto it = load_thread_jobs_.find(model);
  if (it != load_thread_jobs_.end() && --it->second == 0) load_thread_jobs_.erase(it);
}

void Worker::HandleUnload(const v1::WorkerUnload& request, bool on_load_thread) {
  std::optional<JobMark> mark(std::in_place, *this, request.job(), request.model());
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard lock(models_mutex_);
    auto it = models_.find(request.model());
    if (it != models_.end()) {
      engine = std::move(it->second);
      models_.erase(it);
    }
  }
  FaultsFor(request.job(), request.faults()).Hit("unload.mid");
  engine.reset();  // closes the engine: its regions go back to the memory service
  mark.reset();
  v1::WorkerEnvelope reply;
  reply.mutable_unload_done()->set_job(request.job());
  if (on_load_thread) LoadThreadJobDone(request.model());
  Send(reply);
}

void Worker::LoadLoop() {
  for (;;) {
    LoadJob job;
    {
      std::unique_lock lock(load_mutex_);
      load_cv_.wait(lock, [&] { return stopping_ || !load_queue_.empty(); });
      if (stopping_) return;
      job = std::move(load_queue_.front());
      load_queue_.pop_front();
    }
    const uint64_t id = job.load ? job.load->job() : job.attach ? job.attach->job() : 0;
    load_thread_job_.store(id);
    if (job.load) RunLoad(*job.load, job.fd);
    else if (job.attach) HandleAttach(*job.attach, job.fd);
    else HandleUnload(*job.unload, /*on_load_thread=*/true);
    load_thread_job_.store(0);
    if (id != 0) DropOffer(id);
  }
}

void Worker::HandleAttach(const v1::WorkerAttach& request, int weights_fd) {
  std::optional<JobMark> mark(std::in_place, *this, request.job(), request.model());
  v1::WorkerEnvelope reply;
  v1::WorkerLoadDone* done = reply.mutable_load_done();
  done->set_job(request.job());
  JobFaults faults = FaultsFor(request.job(), request.faults());
  Status status;
  Result<const wp_engine_vtable*> vtable = ResolveEngine(request.engine(), options_.engine_dir);
  const std::string& header = request.header();
  wp_engine_spec spec{request.name().c_str(), request.path().c_str(),
                      reinterpret_cast<const uint8_t*>(header.data()), header.size(),
                      request.file_size()};
  if (!vtable.ok()) {
    status = vtable.status();
  } else {
    Result<Engine> engine = Engine::Open(*vtable, spec, &memory_service_);
    if (!engine.ok()) {
      status = engine.status();
    } else {
      wp_region region{nullptr, 0, -1};
      if (request.weight_bytes() > 0) {
        if (weights_fd < 0) {
          status = Error(Code::kInternal, "attach of \"{}\" came without its weights", request.name());
        } else if (request.copy()) {
          Result<wp_region> copied = CopyToDevice(weights_fd, request.weight_bytes());
          if (copied.ok()) region = *copied;
          else status = copied.status();
        } else if (memory_service_.import(memory_service_.ctx, weights_fd, request.weight_bytes(),
                                          &region) != WP_OK) {
          status = Error(Code::kInternal, "cannot map the shared weights of \"{}\"", request.name());
        }
      }
      if (status.ok()) {
        faults.Hit("attach.mid");  // weights mapped, engine not yet serving
        status = engine->Attach(region);
        if (!status.ok() && region.ptr != nullptr) memory_service_.free(memory_service_.ctx, &region);
      }
      int shared = -1;
      if (status.ok()) {
        const wp_engine_info& info = engine->info();
        done->set_weight_bytes(info.weight_bytes);
        done->set_workspace_bytes(info.workspace_bytes);
        done->set_in_features(info.in_features);
        done->set_out_features(info.out_features);
        done->set_header(request.header());  // what it was told the weights are
        done->set_file_size(request.file_size());
        // Unparked weights live in a new device region: the supervisor holds that one now.
        if (request.copy() && region.handle >= 0) {
          shared = region.handle;
          done->set_weights_shared(true);
          done->set_grant(GrantOf(region));
          KeepMappingOf(shared);
        }
        std::lock_guard lock(models_mutex_);
        models_[request.model()] = std::make_shared<Engine>(std::move(*engine));
      }
      if (weights_fd >= 0) close(weights_fd);  // the import made its own copy
      if (!status.ok()) ipc::SetError(done->mutable_error(), status);
      mark.reset();
      LoadThreadJobDone(request.model());
      Send(reply, shared >= 0 ? std::vector<int>{shared} : std::vector<int>{});
      return;
    }
  }
  if (weights_fd >= 0) close(weights_fd);
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  mark.reset();
  LoadThreadJobDone(request.model());
  Send(reply);
}

Result<wp_region> Worker::CopyToDevice(int host_fd, uint64_t bytes) {
  wp_region device{nullptr, 0, -1};
  if (memory_service_.alloc(memory_service_.ctx, bytes, &device) != WP_OK) {
    return Error(Code::kResourceExhausted, "cannot allocate {} bytes of device memory to unpark", bytes);
  }
  bool copied = false;
  if (memory_service_.host_addressable != 0) {
    // Host memory: read from the copy's memfd straight into the region, a few threads at once;
    // the copy is never mapped here, which would cost a page-table entry per page for one pass.
    auto* destination = static_cast<uint8_t*>(device.ptr);
    copied = ForEachChunk(bytes, HostMemory::kCopyChunkBytes, HostMemory::kCopyThreads, [&](uint64_t offset, uint64_t length) {
      for (uint64_t done = 0; done < length;) {
        const ssize_t n = pread(host_fd, destination + offset + done, length - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        done += static_cast<uint64_t>(n);
      }
      return true;
    });
  } else {
    // A GPU: its service copies from host memory it pins for the copy (devmem/cuda_memory.h).
    Result<HostRegion> host = host_memory_.Import(host_fd, bytes, /*read_only=*/false);  // pinned for the copy
    if (host.ok()) {
      copied = memory_service_.write(memory_service_.ctx, &device, 0, host->ptr, bytes) == WP_OK;
      host_memory_.Free(*host);  // the host copy's mapping; the supervisor keeps the copy itself
    }
  }
  if (!copied) {
    memory_service_.free(memory_service_.ctx, &device);
    return Error(Code::kInternal, "cannot copy {} parked bytes into device memory", bytes);
  }
  return device;
}

void Worker::HandlePark(const v1::WorkerPark& request) {
  std::optional<JobMark> mark(std::in_place, *this, request.job(), request.model());
  v1::WorkerEnvelope reply;
  v1::WorkerParkDone* done = reply.mutable_park_done();
  done->set_job(request.job());
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard lock(models_mutex_);
    auto it = models_.find(request.model());
    if (it != models_.end()) engine = it->second;
  }
  int copy = -1;
  Status status;
  if (engine == nullptr) {
    status = Error(Code::kUnavailable, "model {} is not loaded in worker {}", request.model(), options_.slot);
  } else {
    Result<wp_region> weights = engine->ExportWeights();
    if (!weights.ok() || weights->ptr == nullptr) {
      status = Error(Code::kFailedPrecondition, "the model has no weights to park");
    } else {
      Result<int> host = HostMemory::CopyToHost(memory_service_, *weights, TakeOffer(request.job()));
      if (!host.ok()) status = host.status();
      else {
        copy = *host;
        done->set_bytes(weights->bytes);
        done->set_copy_shared(true);
      }
    }
  }
  DropOffer(request.job());  // offered memory the park did not get to use
  FaultsFor(request.job(), request.faults()).Hit("park.mid");
  if (!status.ok()) ipc::SetError(done->mutable_error(), status);
  mark.reset();
  Send(reply, copy >= 0 ? std::vector<int>{copy} : std::vector<int>{});
  if (copy >= 0) close(copy);  // the supervisor got its own descriptor
}

}  // namespace warmpool::worker
