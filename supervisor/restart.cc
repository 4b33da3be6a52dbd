#include "supervisor/restart.h"

#include <unistd.h>

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "supervisor/takeover.h"

namespace warmpool::supervisor {

Restart::Restart(const Config& config, bool notifying) : config_(config), notifying_(notifying) {
  // The descriptor store keeps weights across restarts where the service manager has one
  // (systemd >= 254 says how large in $FDSTORE; older ones say nothing, and are asked anyway).
  const char* fdstore = std::getenv("FDSTORE");
  const unsigned long slots = fdstore == nullptr ? 0 : std::strtoul(fdstore, nullptr, 10);
  store_ = std::make_unique<WarmStore>(config_.instance, notifying_ && (fdstore == nullptr || slots != 0));
  // Each model keeps its weights or parked copy, and a parked language model its KV cache too; two
  // manifests overlap while one replaces the other.
  if (slots != 0 && slots < 2ul * config_.max_models + 2ul) {
    spdlog::warn("FileDescriptorStoreMax={} is less than twice [limits] max_models + 2 ({}): some warm "
                 "models or KV caches will load again after a restart",
                 slots, 2ul * config_.max_models + 2ul);
  }
}

Result<Restart::Received> Restart::Receive(std::vector<PassedDescriptor>& passed, bool activated) {
  Received received;
  // --takeover: what the running daemon hands over (its listening socket among them) joins what
  // the service manager passed.
  if (config_.takeover) {
    if (activated || notifying_) {
      return Error(Code::kFailedPrecondition,
                   "--takeover is for a daemon started by hand; under systemd restart the service "
                   "instead (systemctl restart warmpool): the descriptor store keeps models warm");
    }
    Result<std::vector<PassedDescriptor>> handed = TakeOver(config_.socket_path);
    if (!handed.ok()) return handed.status();
    for (PassedDescriptor& d : *handed) {
      if (d.name == kHandedSocketName) received.taken_socket = d.fd;
      else passed.push_back(d);
    }
    spdlog::info("took over from the daemon on {}: {} descriptors", config_.socket_path, handed->size());
  }
  received.kept = store_->Receive(passed, /*device_memfds=*/config_.backend != Backend::kCuda);
  return received;
}

bool Restart::HandOverTo(int channel, int listener, const std::vector<KeptWeights>& kept,
                         const std::function<void()>& before_end, Status* failed) {
  // From here on no memory this daemon lets go of is reused (Forget): the new daemon maps it.
  handed_over_ = true;
  bool ended = false;
  Status sent = HandOver(channel, listener, kept, config_.instance, [&] {
    before_end();
    ended = true;
  });
  close(channel);
  if (!sent.ok() && !ended) {
    // The new daemon went away before it had everything: it gives up, this one goes on serving.
    handed_over_ = false;
    *failed = Error(Code::kUnavailable, "the takeover failed: {}", sent.message());
    return false;
  }
  if (!sent.ok()) {
    spdlog::error("takeover failed at its last step, stopping: {}", sent.ToString());
  } else {
    spdlog::info("handed the socket and {} kept weights to a new warmpoold; draining and stopping", kept.size());
  }
  *failed = sent;
  return true;
}


}  // namespace warmpool::supervisor
