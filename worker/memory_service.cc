#include "worker/memory_service.h"

#include <unistd.h>

#include <cerrno>

#include <spdlog/spdlog.h>

#include "common/chunks.h"
#include "ipc/error_proto.h"

namespace warmpool::worker {

MemoryService::MemoryService(const WorkerOptions& options, Outbox& outbox)
    : options_(options),
      outbox_(outbox),
      host_memory_(options.backend == Backend::kHost ? options.budget_bytes : 0),
      device_(host_memory_.service()),
      engines_{this, &MemoryService::AllocWithFaults, &MemoryService::FreeRegion, 1, &MemoryService::ImportRegion,
               &MemoryService::WriteRegion, &MemoryService::ReadRegion} {}

MemoryService::~MemoryService() {
  for (auto& [request, grant] : grants_) {
    if (grant.fd >= 0) close(grant.fd);
  }
}

Status MemoryService::Open() {
  if (options_.backend == Backend::kHost) return OkStatus();
#ifdef WARMPOOL_HAVE_CUDA
  if (options_.backend == Backend::kCuda) {
    const CudaSharing sharing = options_.sharing == "legacy" ? CudaSharing::kLegacy : CudaSharing::kVmm;
    Result<std::unique_ptr<CudaMemory>> opened = CudaMemory::Open(
        static_cast<int>(options_.device), sharing,
        [this](uint64_t bytes) -> Result<OwnerGrant> {
          GrantReply reply = RequestGrant(bytes);
          if (!reply.status.ok()) return reply.status;
          return OwnerGrant{reply.grant, reply.fd, reply.bytes};
        },
        [this](uint64_t grant) {
          v1::WorkerEnvelope freed;
          freed.mutable_free()->set_grant(grant);
          outbox_.Send(freed);
        });
    if (!opened.ok()) return opened.status();
    cuda_memory_ = std::move(*opened);
    device_ = cuda_memory_->service();
    engines_.host_addressable = device_->host_addressable;
    return OkStatus();
  }
#endif
  return Error(Code::kInvalidArgument, "backend \"{}\" is not built into this worker", BackendName(options_.backend));
}

wp_status MemoryService::AllocWithFaults(void* ctx, uint64_t bytes, wp_region* out) {
  auto* self = static_cast<MemoryService*>(ctx);
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
  if (status == WP_OK && self->alloc_faults_ != nullptr) self->alloc_faults_->Hit("load.after_alloc");
  return status;
}

void MemoryService::FreeRegion(void* ctx, wp_region* region) {
  const wp_device_memory* device = static_cast<MemoryService*>(ctx)->device_;
  device->free(device->ctx, region);
}

wp_status MemoryService::ImportRegion(void* ctx, int handle, uint64_t bytes, wp_region* out) {
  const wp_device_memory* device = static_cast<MemoryService*>(ctx)->device_;
  return device->import(device->ctx, handle, bytes, out);
}

wp_status MemoryService::WriteRegion(void* ctx, const wp_region* region, uint64_t offset, const void* source,
                                     uint64_t bytes) {
  const wp_device_memory* device = static_cast<MemoryService*>(ctx)->device_;
  return device->write(device->ctx, region, offset, source, bytes);
}

wp_status MemoryService::ReadRegion(void* ctx, const wp_region* region, uint64_t offset, void* destination,
                                    uint64_t bytes) {
  const wp_device_memory* device = static_cast<MemoryService*>(ctx)->device_;
  return device->read(device->ctx, region, offset, destination, bytes);
}

uint64_t MemoryService::GrantOf(const wp_region& region) const {
#ifdef WARMPOOL_HAVE_CUDA
  if (cuda_memory_ != nullptr) return cuda_memory_->GrantOf(region);
#endif
  (void)region;
  return 0;
}

void MemoryService::KeepMappingOf(int fd) {
  // Host backend only: there the weights are this process's memfd mappings (devmem/host_memory.h).
  if (options_.backend == Backend::kHost) host_memory_.KeepMappingOf(fd);
}

MemoryService::GrantReply MemoryService::RequestGrant(uint64_t bytes) {
  if (std::this_thread::get_id() == reader_thread_) {
    // The grant would arrive on the channel this thread reads: it would wait for itself.
    return GrantReply{Error(Code::kFailedPrecondition,
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
  outbox_.Send(ask);
  std::unique_lock lock(grant_mutex_);
  grant_cv_.wait(lock, [&] { return grants_closed_ || grants_.count(request) != 0; });
  auto it = grants_.find(request);
  if (it == grants_.end()) {
    return GrantReply{Error(Code::kUnavailable, "the supervisor went away before granting device memory")};
  }
  GrantReply reply = std::move(it->second);
  grants_.erase(it);
  return reply;
}

void MemoryService::OnGrant(const v1::WorkerAllocated& reply, int fd) {
  GrantReply grant;
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

void MemoryService::CloseGrants() {
  {
    std::lock_guard lock(grant_mutex_);
    grants_closed_ = true;
  }
  grant_cv_.notify_all();
}

void MemoryService::StoreOffer(uint64_t job, int fd) {
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

int MemoryService::TakeOffer(uint64_t job) {
  if (job == 0) return -1;
  std::lock_guard lock(offers_mutex_);
  auto it = offers_.find(job);
  if (it == offers_.end()) return -1;
  const int fd = it->second;
  offers_.erase(it);
  return fd;
}

void MemoryService::DropOffer(uint64_t job) {
  const int fd = TakeOffer(job);
  if (fd >= 0) close(fd);
}

Result<int> MemoryService::CopyToHost(const wp_region& weights, uint64_t job) {
  return HostMemory::CopyToHost(engines_, weights, TakeOffer(job));
}

Result<wp_region> MemoryService::CopyToDevice(int host_fd, uint64_t bytes) {
  wp_region device{nullptr, 0, -1};
  if (engines_.alloc(engines_.ctx, bytes, &device) != WP_OK) {
    return Error(Code::kResourceExhausted, "cannot allocate {} bytes of device memory to unpark", bytes);
  }
  bool copied = false;
  if (engines_.host_addressable != 0) {
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
      copied = engines_.write(engines_.ctx, &device, 0, host->ptr, bytes) == WP_OK;
      host_memory_.Free(*host);  // the host copy's mapping; the supervisor keeps the copy itself
    }
  }
  if (!copied) {
    engines_.free(engines_.ctx, &device);
    return Error(Code::kInternal, "cannot copy {} parked bytes into device memory", bytes);
  }
  return device;
}

}  // namespace warmpool::worker
