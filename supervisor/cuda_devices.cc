#include "supervisor/cuda_devices.h"

#include <unistd.h>

#include <algorithm>

#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "common/units.h"
#include "devmem/legacy_handle_fd.h"
#include "ipc/error_proto.h"
#include "ipc/framing.h"
#include "shm/layout.h"
#include "supervisor/policy/device_owner.h"
#include "supervisor/worker_pool.h"

namespace warmpool::supervisor {

CudaDevices::CudaDevices(uv_loop_t* loop, std::string owner_path, std::function<void(Event)> dispatch)
    : loop_(loop), owner_path_(std::move(owner_path)), dispatch_(std::move(dispatch)) {}

CudaDevices::~CudaDevices() {
  owners_.reset();
  for (auto& o : owner_states_) o->restart_timer.Close();
}

Status CudaDevices::Configure(const BackendChoice& choice, Config& config) {
  config_ = &config;
  // Devices are numbered as CUDA numbers them (CUDA_VISIBLE_DEVICES picks which, and their
  // order): device d is CUDA ordinal d, served by its own owner and workers.
  std::vector<ProbedDevice> devices = choice.devices;
  if (devices.size() > shm::kMaxDevices) {
    spdlog::warn("{} CUDA devices found; serving from the first {} (choose with CUDA_VISIBLE_DEVICES)",
                 devices.size(), shm::kMaxDevices);
    devices.resize(shm::kMaxDevices);
  }
  // One way of sharing for every device: vmm when each can export memory as descriptors.
  const bool all_fds = std::all_of(devices.begin(), devices.end(), [](const ProbedDevice& d) { return d.fd_handles; });
  sharing_ = config.cuda_sharing;
  if (sharing_ == "auto") sharing_ = all_fds ? "vmm" : "legacy";
  config.devices.clear();
  for (const ProbedDevice& device : devices) {
    if (sharing_ == "vmm" && !device.fd_handles) {
      return Error(Code::kFailedPrecondition,
                   "[cuda] sharing = \"vmm\", but CUDA device {} ({}) cannot export memory as file "
                   "descriptors: set sharing = \"auto\" or \"legacy\"",
                   device.ordinal, device.name);
    }
    uint64_t budget = config.budget_bytes;
    if (config.budget_is_default) {
      if (device.free_bytes <= config.cuda_reserve_bytes) {
        return Error(Code::kFailedPrecondition,
                     "CUDA device {} ({}) has {} free, no more than [cuda] reserve ({}): free memory "
                     "on the device, lower the reserve, set [pool] budget, or leave the device out "
                     "with CUDA_VISIBLE_DEVICES",
                     device.ordinal, device.name, FormatBytes(device.free_bytes),
                     FormatBytes(config.cuda_reserve_bytes));
      }
      budget = device.free_bytes - config.cuda_reserve_bytes;
    } else if (budget > device.free_bytes) {
      spdlog::warn("the budget ({}) is more than CUDA device {} has free ({}): loads may run out of memory",
                   FormatBytes(budget), device.ordinal, FormatBytes(device.free_bytes));
    }
    config.devices.push_back(DeviceConfig{device.name, device.total_bytes, budget});
    ordinals_.push_back(device.ordinal);
    spdlog::info("CUDA device {}: {} ({} free of {}), budget {}{}", device.ordinal, device.name,
                 FormatBytes(device.free_bytes), FormatBytes(device.total_bytes), FormatBytes(budget),
                 config.budget_is_default ? " (free less [cuda] reserve)" : "");
  }
  config.backend = Backend::kCuda;  // resolved: what status and the log report
  // As resolved: the workers share memory this way, and the core keeps device weights only if
  // shared by descriptor.
  config.cuda_sharing = sharing_;
  spdlog::info("backend cuda ({}): {} device{}, sharing {}", choice.why, ordinals_.size(),
               ordinals_.size() == 1 ? "" : "s", sharing_);
  return OkStatus();
}

Status CudaDevices::Start(WorkerPool* workers) {
  workers_ = workers;
  DeviceOwnerEvents events;
  events.on_ready = [this](uint32_t d, const v1::OwnerHello& hello) {
    spdlog::info("memory owner of CUDA device {} ({}) up: pid {}, {} free of {}, sharing {}", d, hello.name(),
                 hello.pid(), FormatBytes(hello.free_bytes()), FormatBytes(hello.total_bytes()), hello.sharing());
    dispatch_(event::DeviceRestored{d});
  };
  events.on_allocated = [this](uint32_t d, const v1::OwnerAllocated& allocated, int fd) {
    OnAllocated(d, allocated, fd);
  };
  events.on_death = [this](uint32_t d, const std::string& why, bool fatal) { OnOwnerDeath(d, why, fatal); };
  owners_ = std::make_unique<DeviceOwners>(loop_, DeviceOwnersOptions{owner_path_, sharing_, ordinals_},
                                           std::move(events));
  for (uint32_t d = 0; d < ordinals_.size(); d++) {
    auto state = std::make_unique<Owner>();
    state->devices = this;
    state->device = d;
    uv_timer_init(loop_, state->restart_timer.get());
    state->restart_timer.MarkInitialized();
    state->restart_timer.get()->data = state.get();
    owner_states_.push_back(std::move(state));
  }
  for (auto& o : owner_states_) {
    if (!owners_->Start(o->device)) {
      return Error(Code::kFailedPrecondition, "cannot start the memory owner of CUDA device {} ({})",
                   o->device, owner_path_);
    }
    o->started_ms = MonotonicMillis();
  }
  return OkStatus();
}

void CudaDevices::Shutdown() {
  if (owners_ != nullptr) owners_->Shutdown();
  for (auto& o : owner_states_) {
    if (o->restart_timer.active()) uv_timer_stop(o->restart_timer.get());
  }
}

bool CudaDevices::OnWorkerMessage(uint32_t slot, const v1::WorkerEnvelope& message) {
  if (message.has_allocate()) {
    OnAllocate(slot, message.allocate());
    return true;
  }
  if (message.has_free()) {
    if (std::optional<GrantRelease> r = grants_.Freed(message.free().grant(), slot)) ReleaseGrant(*r);
    return true;
  }
  return false;
}

void CudaDevices::OnKept(uint32_t slot, uint64_t grant, int fd, const char* what) {
  if (grant != 0 && !grants_.Kept(grant, slot, fd)) {
    spdlog::warn("worker {} named grant {} for its {}, which it was not given", slot, grant, what);
  }
}

void CudaDevices::OnWorkerGone(uint32_t slot, uint32_t generation) {
  for (const GrantRelease& r : grants_.WorkerGone(slot, generation)) ReleaseGrant(r);
}

void CudaDevices::OnAllocate(uint32_t slot, const v1::WorkerAllocate& request) {
  const uint32_t device = slot / config_->workers_per_device;
  Owner& owner = *owner_states_[device];
  const uint32_t generation = workers_->generation(slot);
  policy::GrantAsk ask;
  ask.slot = slot;
  ask.device = device;
  ask.bytes = request.bytes();
  ask.held = grants_.Unkept(slot, generation);
  ask.budget = config_->devices[device].budget_bytes;
  ask.owner_fatal = owner.fatal;
  ask.owner_running = owners_->running(device);
  ask.owner_restart_delay_ms = owner.restart_delay_ms;
  if (Status refused = policy::AdmitGrant(ask); !refused.ok()) {
    v1::WorkerEnvelope reply;
    v1::WorkerAllocated* a = reply.mutable_allocated();
    a->set_request(request.request());
    ipc::SetError(a->mutable_error(), refused);
    workers_->SendFrame(slot, ipc::Frame(reply));
    return;
  }
  const uint64_t grant = grants_.Ask(device, slot, generation, request.request(), request.bytes());
  v1::OwnerEnvelope message;
  message.mutable_allocate()->set_id(grant);
  message.mutable_allocate()->set_bytes(request.bytes());
  // While the owner is being restarted the request waits for it (a load waits, it does not fail;
  // a worker that dies meanwhile has its grant released with the rest).
  if (!owners_->Send(device, message)) owner.waiting.push_back(std::move(message));
}
void CudaDevices::OnAllocated(uint32_t device, const v1::OwnerAllocated& allocated, int fd) {
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

void CudaDevices::OnOwnerDeath(uint32_t device, const std::string& why, bool fatal) {
  spdlog::error("the memory owner of CUDA device {} {}: the weights it held are gone", device, why);
  Owner& owner = *owner_states_[device];
  grants_.OwnerGone(device);
  owner.waiting.clear();  // their grants went with the owner; the workers are killed below
  if (fatal) {
    owner.fatal = true;
    spdlog::critical("the memory owner of CUDA device {} cannot run (exit status 2, fatal configuration); "
                     "not starting it again: fix the driver or configuration and restart warmpoold", device);
  }
  dispatch_(event::DeviceLost{device, why, fatal});
  if (fatal) return;
  // Started again shortly, unless it keeps dying young (a broken driver): then after a growing
  // pause (policy/device_owner.h).
  owner.restart_delay_ms =
      policy::RespawnDelay(owner.restart_delay_ms, MonotonicMillis() - owner.started_ms, policy::kOwnerRespawn);
  ScheduleRestart(owner);
}

void CudaDevices::ScheduleRestart(Owner& owner) {
  uv_timer_start(owner.restart_timer.get(), [](uv_timer_t* t) {
    auto* o = static_cast<Owner*>(t->data);
    o->devices->RestartOwner(o->device);
  }, owner.restart_delay_ms, 0);
}

void CudaDevices::RestartOwner(uint32_t device) {
  Owner& owner = *owner_states_[device];
  if (owners_ == nullptr || owners_->running(device)) return;
  if (!owners_->Start(device)) {
    owner.restart_delay_ms = policy::kOwnerRespawn.respawn_max_ms;
    return ScheduleRestart(owner);
  }
  owner.started_ms = MonotonicMillis();
  for (v1::OwnerEnvelope& ask : owner.waiting) owners_->Send(device, ask);
  owner.waiting.clear();
}

void CudaDevices::ReleaseGrant(const GrantRelease& release) {
  if (owners_ == nullptr) return;
  v1::OwnerEnvelope message;
  message.mutable_release()->set_id(release.grant);
  owners_->Send(release.device, message);
}

void CudaDevices::Release(int fd, bool) {
  if (std::optional<GrantRelease> r = grants_.Closed(fd)) ReleaseGrant(*r);
  close(fd);
}

}  // namespace warmpool::supervisor
