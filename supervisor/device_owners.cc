#include "supervisor/device_owners.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ipc/descriptors.h"
#include "ipc/exit_status.h"
#include "ipc/framing.h"
#include "supervisor/child_process.h"

namespace warmpool::supervisor {

struct DeviceOwners::Owner {
  uint32_t device = 0;
  int pid = 0;
  bool running = false;
  bool ready = false;
  ipc::Connection* channel = nullptr;
  std::unique_ptr<ipc::UvHandle<uv_process_t>> process;
  DeviceOwners* owners = nullptr;
};

DeviceOwners::DeviceOwners(uv_loop_t* loop, DeviceOwnersOptions options, DeviceOwnerEvents events)
    : loop_(loop), options_(std::move(options)), events_(std::move(events)) {
  for (uint32_t device : options_.devices) {
    auto owner = std::make_unique<Owner>();
    owner->device = device;
    owner->owners = this;
    owners_.push_back(std::move(owner));
  }
}

DeviceOwners::~DeviceOwners() {
  for (auto& o : owners_) {
    if (o->channel != nullptr) o->channel->Close(OkStatus());
    if (o->running && o->pid > 0) kill(o->pid, SIGKILL);
  }
}

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
  return o != nullptr && o->running && o->channel != nullptr;
}

bool DeviceOwners::Start(uint32_t device) {
  Owner* found = Find(device);
  if (found == nullptr || found->running || shutting_down_) return false;
  Owner& o = *found;
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    spdlog::error("cannot start the owner of CUDA device {}: socketpair: {}", device, std::strerror(errno));
    return false;
  }
  std::vector<std::string> args = {options_.owner_path, "--channel-fd", "3", "--device", std::to_string(device),
                                   "--sharing", options_.sharing, "--parent", std::to_string(getpid())};
  o.process = std::make_unique<ipc::UvHandle<uv_process_t>>();
  o.process->get()->data = &o;
  int rc = SpawnChild(loop_, o.process->get(), args, fds[1], [](uv_process_t* process, int64_t exit_status,
                                                               int term_signal) {
    auto* owner = static_cast<Owner*>(process->data);
    owner->owners->OnExit(*owner, exit_status, term_signal);
  });
  close(fds[1]);
  o.process->MarkInitialized();
  if (rc != 0) {
    o.process.reset();
    close(fds[0]);
    spdlog::error("cannot start the owner of CUDA device {} ({}): {}", device, options_.owner_path, uv_strerror(rc));
    return false;
  }
  o.pid = o.process->get()->pid;
  o.running = true;
  o.ready = false;
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  ipc::Connection::Options channel_options;
  channel_options.max_frame_bytes = 1u << 20;
  channel_options.max_pending_write_bytes = SIZE_MAX;  // bounded by the workers' requests
  channel_options.accept_fds = true;                   // exported allocations
  Owner* self = &o;
  o.channel = ipc::Connection::Open(
      loop_, fds[0], channel_options,
      [this, self](std::string_view body) {
        v1::OwnerEnvelope message;
        if (!message.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
          spdlog::error("the owner of CUDA device {} sent a malformed message; stopping it", self->device);
          if (self->pid > 0) kill(self->pid, SIGKILL);
          return;
        }
        if (message.has_hello()) {
          self->ready = true;
          if (events_.on_ready) events_.on_ready(self->device, message.hello());
        } else if (message.has_allocated()) {
          const int fd = ipc::DescriptorsCarried(message) > 0 ? self->channel->TakeFd() : -1;
          if (events_.on_allocated) events_.on_allocated(self->device, message.allocated(), fd);
          else if (fd >= 0) close(fd);
        }
      },
      [this, self](const Status& why) {
        self->channel = nullptr;
        // EOF with the process still there: make the exit certain, and learn of it from the kernel.
        if (self->running && self->pid > 0 && !shutting_down_) kill(self->pid, SIGKILL);
      });
  return true;
}

void DeviceOwners::OnExit(Owner& o, int64_t exit_status, int term_signal) {
  std::string why = term_signal != 0 ? fmt::format("killed by signal {} ({})", term_signal, strsignal(term_signal))
                                     : fmt::format("exited with status {}", exit_status);
  o.running = false;
  o.ready = false;
  if (o.channel != nullptr) {
    o.channel->Drain();  // answers it wrote before dying still count
    ipc::Connection* channel = o.channel;
    o.channel = nullptr;
    if (channel != nullptr) channel->Close(OkStatus());
  }
  o.process.reset();
  if (!shutting_down_ && events_.on_death) events_.on_death(o.device, why, ipc::IsFatalExit(exit_status, term_signal));
}

bool DeviceOwners::Send(uint32_t device, const v1::OwnerEnvelope& message) {
  Owner* o = Find(device);
  if (o == nullptr || !o->running || o->channel == nullptr) return false;
  o->channel->Send(ipc::Frame(message));
  return true;
}

void DeviceOwners::Kill(uint32_t device) {
  Owner* o = Find(device);
  if (o != nullptr && o->running && o->pid > 0) kill(o->pid, SIGKILL);
}

void DeviceOwners::Shutdown() {
  shutting_down_ = true;
  for (auto& o : owners_) {
    if (o->channel != nullptr) {
      ipc::Connection* channel = o->channel;
      o->channel = nullptr;
      channel->Close(OkStatus());  // EOF: the owner releases everything and exits
    }
  }
}

}  // namespace warmpool::supervisor
