// The cuda backend's part of the shell: one memory owner per device, and the grants of device
// memory between workers and their device's owner (supervisor/grants.h). The core sees none of it
// but the weights' handles, and event::DeviceLost when an owner dies.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

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
  std::string sharing = config_.cuda_sharing;
  if (sharing == "auto") sharing = all_fds ? "vmm" : "legacy";
  config_.devices.clear();
  std::vector<uint32_t> ordinals;
  for (const ProbedDevice& device : devices) {
    if (sharing == "vmm" && !device.fd_handles) {
      return Error(Code::kFailedPrecondition,
                   "[cuda] sharing = \"vmm\", but CUDA device {} ({}) cannot export memory as file "
                   "descriptors: set sharing = \"auto\" or \"legacy\"",
                   device.ordinal, device.name);
    }
    uint64_t budget = config_.budget_bytes;
    if (config_.budget_is_default) {
      if (device.free_bytes <= config_.cuda_reserve_bytes) {
        return Error(Code::kFailedPrecondition,
                     "CUDA device {} ({}) has {} free, no more than [cuda] reserve ({}): free memory "
                     "on the device, lower the reserve, set [pool] budget, or leave the device out "
                     "with CUDA_VISIBLE_DEVICES",
                     device.ordinal, device.name, FormatBytes(device.free_bytes),
                     FormatBytes(config_.cuda_reserve_bytes));
      }
      budget = device.free_bytes - config_.cuda_reserve_bytes;
    } else if (budget > device.free_bytes) {
      spdlog::warn("the budget ({}) is more than CUDA device {} has free ({}): loads may run out of memory",
                   FormatBytes(budget), device.ordinal, FormatBytes(device.free_bytes));
    }
    config_.devices.push_back(DeviceConfig{device.name, device.total_bytes, budget});
    ordinals.push_back(device.ordinal);
    spdlog::info("CUDA device {}: {} ({} free of {}), budget {}{}", device.ordinal, device.name,
                 FormatBytes(device.free_bytes), FormatBytes(device.total_bytes), FormatBytes(budget),
                 config_.budget_is_default ? " (free less [cuda] reserve)" : "");
  }
  config_.backend = "cuda";  // resolved: what status and the log report
  pool.backend = "cuda";
  pool.sharing = sharing;
  config_.cuda_sharing = sharing;  // as resolved: the core keeps device weights only if shared by descriptor
  pool.tf32 = config_.cuda_tf32;

  DeviceOwnersOptions options{owner_path, sharing, ordinals};
  DeviceOwnerEvents events;
  events.on_ready = [this](uint32_t d, const v1::OwnerHello& hello) {
    spdlog::info("memory owner of CUDA device {} ({}) up: pid {}, {} free of {}, sharing {}", d, hello.name(),
                 hello.pid(), FormatBytes(hello.free_bytes()), FormatBytes(hello.total_bytes()), hello.sharing());
    Dispatch(event::DeviceRestored{d});
  };
  events.on_allocated = [this](uint32_t d, const v1::OwnerAllocated& allocated, int fd) {
    OnOwnerAllocated(d, allocated, fd);
  };
  events.on_death = [this](uint32_t d, const std::string& why, bool fatal) { OnOwnerDeath(d, why, fatal); };
  owners_ = std::make_unique<DeviceOwners>(&loop_, options, std::move(events));
  for (uint32_t d = 0; d < ordinals.size(); d++) {
    auto state = std::make_unique<OwnerState>();
    state->daemon = this;
    state->device = d;
    uv_timer_init(&loop_, state->restart_timer.get());
    state->restart_timer.MarkInitialized();
    state->restart_timer.get()->data = state.get();
    owner_states_.push_back(std::move(state));
  }
  spdlog::info("backend cuda ({}): {} device{}, sharing {}", choice.why, ordinals.size(),
               ordinals.size() == 1 ? "" : "s", sharing);
  return OkStatus();
}

Status Daemon::StartOwners(const std::string& owner_path) {
  for (auto& o : owner_states_) {
    if (!owners_->Start(o->device)) {
      return Error(Code::kFailedPrecondition, "cannot start the memory owner of CUDA device {} ({})",
                   o->device, owner_path);
    }
    o->started_ms = MonotonicMillis();
  }
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
  // A worker gets memory on its own device only.
  const uint32_t device = slot / config_.workers_per_device;
  OwnerState& owner = *owner_states_[device];
  if (owner.fatal) {
    return refuse(Error(Code::kUnavailable, "the memory owner of CUDA device {} cannot run (see the log): fix "
                                            "the driver or configuration and restart warmpoold", device));
  }
  if (!owners_->running(device) && owner.restart_delay_ms > kOwnerPatienceMs) {
    // It keeps dying young: a load waiting for it would only stall. It fails now, and says why.
    return refuse(Error(Code::kUnavailable, "the memory owner of CUDA device {} keeps dying; it is started "
                                            "again in {} ms", device, owner.restart_delay_ms));
  }
  // Admission counted what a load needs; an engine asking for more than the whole budget is broken
  // (or hostile), and must not take the device from everyone else.
  const uint32_t generation = workers_->generation(slot);
  const uint64_t budget = config_.devices[device].budget_bytes;
  if (budget != 0 && grants_.Unkept(slot, generation) + request.bytes() > budget) {
    return refuse(Error(Code::kResourceExhausted,
                        "worker {} asked for {} of device memory, beyond the budget of device {} ({}) with "
                        "what it holds already", slot, FormatBytes(request.bytes()), device, FormatBytes(budget)));
  }
  const uint64_t grant = grants_.Ask(device, slot, generation, request.request(), request.bytes());
  v1::OwnerEnvelope ask;
  ask.mutable_allocate()->set_id(grant);
  ask.mutable_allocate()->set_bytes(request.bytes());
  // While the owner is being restarted the request waits for it (a load waits, it does not fail;
  // a worker that dies meanwhile has its grant released with the rest).
  if (!owners_->Send(device, ask)) owner.waiting.push_back(std::move(ask));
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
  OwnerState& owner = *owner_states_[device];
  grants_.OwnerGone(device);
  owner.waiting.clear();  // their grants went with the owner; the workers are killed below
  if (fatal) {
    owner.fatal = true;
    spdlog::critical("the memory owner of CUDA device {} cannot run (exit status 2, fatal configuration); "
                     "not starting it again: fix the driver or configuration and restart warmpoold", device);
  }
  Dispatch(event::DeviceLost{device, why, fatal});
  if (fatal) return;
  // Started again at once, unless it dies young (a broken driver): then after a growing pause.
  const uint64_t lived_ms = MonotonicMillis() - owner.started_ms;
  owner.restart_delay_ms = lived_ms < kOwnerStableMs
                               ? std::min<uint64_t>(std::max<uint64_t>(2 * owner.restart_delay_ms, 100), kOwnerRestartMaxMs)
                               : 0;
  ScheduleOwnerRestart(owner);
}

void Daemon::ScheduleOwnerRestart(OwnerState& owner) {
  uv_timer_start(owner.restart_timer.get(), [](uv_timer_t* t) {
    auto* o = static_cast<OwnerState*>(t->data);
    o->daemon->RestartOwner(o->device);
  }, owner.restart_delay_ms, 0);
}

void Daemon::RestartOwner(uint32_t device) {
  OwnerState& owner = *owner_states_[device];
  if (owners_ == nullptr || owners_->running(device)) return;
  if (!owners_->Start(device)) {
    owner.restart_delay_ms = kOwnerRestartMaxMs;
    return ScheduleOwnerRestart(owner);
  }
  owner.started_ms = MonotonicMillis();
  for (v1::OwnerEnvelope& ask : owner.waiting) owners_->Send(device, ask);
  owner.waiting.clear();
}

void Daemon::ReleaseGrant(const GrantRelease& release) {
  if (owners_ == nullptr) return;
  v1::OwnerEnvelope message;
  message.mutable_release()->set_id(release.grant);
  owners_->Send(release.device, message);
}

void Daemon::CloseHandle(int fd, bool reusable) {
  // Out of the descriptor store before its memory can be reused for anything else: a restart must
  // never adopt a region under a name whose bytes it no longer holds.
  warm_store_->Forget(fd);
  // Never reused: memory a new daemon maps now (handed over), or a daemon before this one mapped
  // (its workers may still read it while it drains).
  if (adopted_handles_.erase(fd) != 0 || handed_over_) reusable = false;
  if (config_.backend == "host") {
    if (reusable) return freed_memory_.Keep(fd);
    // The worker that allocated it may keep a mapping of it: named to the workers, it goes too.
    struct stat st {};
    const bool known = fstat(fd, &st) == 0;
    close(fd);
    if (known) ForgetMappings({static_cast<uint64_t>(st.st_ino)});
    return;
  }
  if (std::optional<GrantRelease> r = grants_.Closed(fd)) ReleaseGrant(*r);
  close(fd);
}

}  // namespace warmpool::supervisor
