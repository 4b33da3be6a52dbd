// The cuda backend's part of the shell: the device's memory owner, and the grants of device memory
// between workers and that owner (supervisor/grants.h). The core sees none of it but the weights'
// handles, and event::DeviceLost when the owner dies.
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/units.h"
#include "devmem/legacy_handle_fd.h"
#include "ipc/error_proto.h"
#include "ipc/framing.h"
#include "supervisor/daemon.h"

namespace warmpool::supervisor {

namespace {

constexpr uint64_t kOwnerStableMs = 10000;       // an owner that lived this long died of something else
constexpr uint64_t kOwnerRestartMaxMs = 30000;
constexpr uint64_t kOwnerPatienceMs = 1000;  // allocations wait for an owner started again within this

}  // namespace

Status Daemon::StartCuda(const BackendChoice& choice, const std::string& owner_path, WorkerPoolOptions& pool) {
  const ProbedDevice& device = choice.devices.front();
  cuda_device_ = device.ordinal;
  if (choice.devices.size() > 1) {
    spdlog::warn("{} CUDA devices found; this version serves from device {} only", choice.devices.size(),
                 cuda_device_);
  }
  std::string sharing = config_.cuda_sharing;
  if (sharing == "auto") sharing = device.fd_handles ? "vmm" : "legacy";
  if (sharing == "vmm" && !device.fd_handles) {
    return Error(Code::kFailedPrecondition,
                 "[cuda] sharing = \"vmm\", but CUDA device {} ({}) cannot export memory as file "
                 "descriptors: set sharing = \"auto\" or \"legacy\"",
                 cuda_device_, device.name);
  }
  if (config_.budget_is_default) {
    if (device.free_bytes <= config_.cuda_reserve_bytes) {
      return Error(Code::kFailedPrecondition,
                   "CUDA device {} ({}) has {} free, no more than [cuda] reserve ({}): free memory "
                   "on the device, lower the reserve or set [pool] budget",
                   cuda_device_, device.name, FormatBytes(device.free_bytes),
                   FormatBytes(config_.cuda_reserve_bytes));
    }
    config_.budget_bytes = device.free_bytes - config_.cuda_reserve_bytes;
  } else if (config_.budget_bytes > device.free_bytes) {
    spdlog::warn("the budget ({}) is more than CUDA device {} has free ({}): loads may run out of memory",
                 FormatBytes(config_.budget_bytes), cuda_device_, FormatBytes(device.free_bytes));
  }
  config_.backend = "cuda";  // resolved: what status and the log report
  config_.device_name = device.name;
  config_.device_total_bytes = device.total_bytes;
  pool.backend = "cuda";
  pool.sharing = sharing;
  pool.device = cuda_device_;

  DeviceOwnersOptions options{owner_path, sharing, {cuda_device_}};
  DeviceOwnerEvents events;
  events.on_ready = [](uint32_t d, const v1::OwnerHello& hello) {
    spdlog::info("memory owner of CUDA device {} ({}) up: pid {}, {} free of {}, sharing {}", d, hello.name(),
                 hello.pid(), FormatBytes(hello.free_bytes()), FormatBytes(hello.total_bytes()), hello.sharing());
  };
  events.on_allocated = [this](uint32_t d, const v1::OwnerAllocated& allocated, int fd) {
    OnOwnerAllocated(d, allocated, fd);
  };
  events.on_death = [this](uint32_t d, const std::string& why, bool fatal) { OnOwnerDeath(d, why, fatal); };
  owners_ = std::make_unique<DeviceOwners>(&loop_, options, std::move(events));
  uv_timer_init(&loop_, owner_restart_timer_.get());
  owner_restart_timer_.MarkInitialized();
  owner_restart_timer_.get()->data = this;
  spdlog::info("backend cuda ({}): device {} {} ({} free of {}), budget {}{}, sharing {}", choice.why,
               cuda_device_, device.name, FormatBytes(device.free_bytes), FormatBytes(device.total_bytes),
               FormatBytes(config_.budget_bytes), config_.budget_is_default ? " (free less [cuda] reserve)" : "",
               sharing);
  return OkStatus();
}

void Daemon::OnWorkerAllocate(uint32_t slot, const v1::WorkerAllocate& request) {
  auto refuse = [&](const Status& why) {
    v1::WorkerEnvelope reply;
    v1::WorkerAllocated* a = reply.mutable_allocated();
    a->set_request(request.request());
    ipc::SetError(a->mutable_error(), why);
    workers_->SendFrame(slot, ipc::Frame(reply));
  };
  if (owners_ == nullptr) {
    return refuse(Error(Code::kFailedPrecondition, "device memory is granted on the cuda backend only"));
  }
  if (owner_fatal_) {
    return refuse(Error(Code::kUnavailable, "the memory owner of CUDA device {} cannot run (see the log): fix "
                                            "the driver or configuration and restart warmpoold", cuda_device_));
  }
  if (!owners_->running(cuda_device_) && owner_restart_delay_ms_ > kOwnerPatienceMs) {
    // It keeps dying young: a load waiting for it would only stall. It fails now, and says why.
    return refuse(Error(Code::kUnavailable, "the memory owner of CUDA device {} keeps dying; it is started "
                                            "again in {} ms", cuda_device_, owner_restart_delay_ms_));
  }
  // Admission counted what a load needs; an engine asking for more than the whole budget is broken
  // (or hostile), and must not take the device from everyone else.
  const uint32_t generation = workers_->generation(slot);
  if (grants_.Unkept(slot, generation) + request.bytes() > config_.budget_bytes) {
    return refuse(Error(Code::kResourceExhausted,
                        "worker {} asked for {} of device memory, beyond the budget ({}) with what it holds "
                        "already", slot, FormatBytes(request.bytes()), FormatBytes(config_.budget_bytes)));
  }
  const uint64_t grant = grants_.Ask(cuda_device_, slot, generation, request.request(), request.bytes());
  v1::OwnerEnvelope ask;
  ask.mutable_allocate()->set_id(grant);
  ask.mutable_allocate()->set_bytes(request.bytes());
  // While the owner is being restarted the request waits for it (a load waits, it does not fail;
  // a worker that dies meanwhile has its grant released with the rest).
  if (!owners_->Send(cuda_device_, ask)) waiting_for_owner_.push_back(std::move(ask));
}

void Daemon::OnOwnerAllocated(uint32_t device, const v1::OwnerAllocated& allocated, int fd) {
  bool release = false;
  std::optional<GrantTable::Asker> asker = grants_.Answered(allocated.id(), &release);
  if (!asker) {
    // Its worker died or freed it meanwhile (release it now), or its owner is another by now.
    if (fd >= 0) close(fd);
    if (release && !allocated.has_error()) ReleaseGrant(GrantRelease{device, allocated.id()});
    return;
  }
  v1::WorkerEnvelope reply;
  v1::WorkerAllocated* a = reply.mutable_allocated();
  a->set_request(asker->request);
  Status failed;
  if (allocated.has_error()) {
    failed = ipc::StatusFromError(allocated.error());
    grants_.Refused(allocated.id());
  } else if (!allocated.ipc_handle().empty()) {
    Result<int> named = LegacyHandleToFd(allocated.ipc_handle(), allocated.bytes());
    if (named.ok()) fd = *named;
    else failed = named.status();
  } else if (fd < 0) {
    failed = Error(Code::kInternal, "the owner of CUDA device {} granted memory without its descriptor", device);
  }
  if (!failed.ok() && !allocated.has_error()) {
    if (std::optional<GrantRelease> r = grants_.Freed(allocated.id(), asker->slot)) ReleaseGrant(*r);
  }
  if (!failed.ok()) {
    ipc::SetError(a->mutable_error(), failed);
    if (fd >= 0) close(fd);
    workers_->SendFrame(asker->slot, ipc::Frame(reply));
    return;
  }
  a->set_grant(allocated.id());
  a->set_bytes(allocated.bytes());
  const bool sent = workers_->generation(asker->slot) == asker->generation &&
                    workers_->SendFrame(asker->slot, ipc::Frame(reply), {fd});
  close(fd);  // the channel keeps its own copy until the frame is written
  if (!sent) {
    if (std::optional<GrantRelease> r = grants_.Freed(allocated.id(), asker->slot)) ReleaseGrant(*r);
  }
}

void Daemon::OnOwnerDeath(uint32_t device, const std::string& why, bool fatal) {
  spdlog::error("the memory owner of CUDA device {} {}: the weights it held are gone", device, why);
  grants_.OwnerGone(device);
  waiting_for_owner_.clear();  // their grants went with the owner; the workers are killed below
  Dispatch(event::DeviceLost{device, why});
  if (fatal) {
    owner_fatal_ = true;
    spdlog::critical("the memory owner of CUDA device {} cannot run (exit status 2, fatal configuration); "
                     "not starting it again: fix the driver or configuration and restart warmpoold", device);
    return;
  }
  // Started again at once, unless it dies young (a broken driver): then after a growing pause.
  const uint64_t lived_ms = MonotonicMillis() - owner_started_ms_;
  owner_restart_delay_ms_ = lived_ms < kOwnerStableMs
                                ? std::min<uint64_t>(std::max<uint64_t>(2 * owner_restart_delay_ms_, 100), kOwnerRestartMaxMs)
                                : 0;
  uv_timer_start(owner_restart_timer_.get(), [](uv_timer_t* t) {
    static_cast<Daemon*>(t->data)->RestartOwner();
  }, owner_restart_delay_ms_, 0);
}

void Daemon::RestartOwner() {
  if (owners_ == nullptr || owners_->running(cuda_device_)) return;
  if (!owners_->Start(cuda_device_)) {
    owner_restart_delay_ms_ = kOwnerRestartMaxMs;
    uv_timer_start(owner_restart_timer_.get(), [](uv_timer_t* t) {
      static_cast<Daemon*>(t->data)->RestartOwner();
    }, owner_restart_delay_ms_, 0);
    return;
  }
  owner_started_ms_ = MonotonicMillis();
  for (v1::OwnerEnvelope& ask : waiting_for_owner_) owners_->Send(cuda_device_, ask);
  waiting_for_owner_.clear();
}

void Daemon::ReleaseGrant(const GrantRelease& release) {
  if (owners_ == nullptr) return;
  v1::OwnerEnvelope message;
  message.mutable_release()->set_id(release.grant);
  owners_->Send(release.device, message);
}

void Daemon::CloseHandle(int fd) {
  if (std::optional<GrantRelease> r = grants_.Closed(fd)) ReleaseGrant(*r);
  close(fd);
}

}  // namespace warmpool::supervisor
