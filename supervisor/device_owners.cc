#include "supervisor/device_owners.h"

#include <unistd.h>

#include <spdlog/spdlog.h>

#include "ipc/child_arguments.h"
#include "ipc/descriptors.h"
#include "ipc/framing.h"

namespace warmpool::supervisor {

struct DeviceOwners::Owner {
  explicit Owner(uv_loop_t* loop) : child(loop) {}
  uint32_t device = 0;
  bool ready = false;  // hello received
  ChildWithChannel child;
};

DeviceOwners::DeviceOwners(uv_loop_t* loop, DeviceOwnersOptions options, DeviceOwnerEvents events)
    : loop_(loop), options_(std::move(options)), events_(std::move(events)) {
  for (uint32_t device : options_.devices) {
    auto owner = std::make_unique<Owner>(loop_);
    owner->device = device;
    owners_.push_back(std::move(owner));
  }
}

DeviceOwners::~DeviceOwners() = default;  // each ChildWithChannel closes its channel and kills its child

DeviceOwners::Owner* DeviceOwners::Find(uint32_t device) {
  for (auto& o : owners_) {
    if (o->device == device) return o.get();
  }
  return nullptr;
}

const DeviceOwners::Owner* DeviceOwners::Find(uint32_t device) const {
  return const_cast<DeviceOwners*>(this)->Find(device);
}

bool DeviceOwners::running(uint32_t device) const {
  const Owner* o = Find(device);
  return o != nullptr && o->child.running() && o->child.has_channel();
}

bool DeviceOwners::Start(uint32_t device) {
  Owner* found = Find(device);
  if (found == nullptr || found->child.running() || shutting_down_) return false;
  Owner& o = *found;
  ipc::OwnerArguments arguments;
  arguments.device = device;
  arguments.sharing = options_.sharing;
  arguments.parent = getpid();
  const std::vector<std::string> args = ipc::OwnerCommandLine(options_.owner_path, arguments);
  ipc::Connection::Options channel;
  channel.max_frame_bytes = 1u << 20;
  channel.max_pending_write_bytes = SIZE_MAX;  // bounded by the workers' requests
  channel.accept_fds = true;                   // exported allocations
  ChildWithChannel::Callbacks callbacks;
  callbacks.on_frame = [this, &o](std::string_view body) { OnFrame(o, body); };
  callbacks.on_exit = [this, &o](const ChildEnd& end) {
    o.ready = false;
    if (!shutting_down_ && events_.on_death) events_.on_death(o.device, end.plain, end.fatal);
  };
  o.ready = false;
  if (std::optional<StartFailure> failed = o.child.Start(args, channel, std::move(callbacks))) {
    spdlog::error("cannot start the owner of CUDA device {} ({}): {}", device, options_.owner_path, failed->why);
    return false;
  }
  return true;
}

void DeviceOwners::OnFrame(Owner& o, std::string_view body) {
  v1::OwnerEnvelope message;
  if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    spdlog::error("the owner of CUDA device {} sent a malformed message; stopping it", o.device);
    o.child.Kill("it sent a malformed message");
    return;
  }
  if (message.has_hello()) {
    o.ready = true;
    if (events_.on_ready) events_.on_ready(o.device, message.hello());
  } else if (message.has_allocated()) {
    const int fd = ipc::DescriptorsCarried(message) > 0 ? o.child.TakeFd() : -1;
    if (events_.on_allocated) events_.on_allocated(o.device, message.allocated(), fd);
    else if (fd >= 0) close(fd);
  }
}

bool DeviceOwners::Send(uint32_t device, const v1::OwnerEnvelope& message) {
  Owner* o = Find(device);
  return o != nullptr && o->child.running() && o->child.Send(ipc::Frame(message));
}

void DeviceOwners::Kill(uint32_t device) {
  if (Owner* o = Find(device)) o->child.Kill("asked to");
}

void DeviceOwners::Shutdown() {
  shutting_down_ = true;
  for (auto& o : owners_) o->child.CloseChannel();  // EOF: the owner releases everything and exits
}

}  // namespace warmpool::supervisor
