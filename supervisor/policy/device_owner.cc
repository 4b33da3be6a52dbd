#include "supervisor/policy/device_owner.h"

#include "common/units.h"

namespace warmpool::supervisor::policy {

Status AdmitGrant(const GrantAsk& ask) {
  if (ask.owner_fatal) {
    return Error(Code::kUnavailable,
                 "the memory owner of CUDA device {} cannot run (see the log): fix the driver or "
                 "configuration and restart warmpoold",
                 ask.device);
  }
  if (!ask.owner_running && ask.owner_restart_delay_ms > kOwnerPatienceMs) {
    // It keeps dying young: a load waiting for it would only stall. It fails now, and says why.
    return Error(Code::kUnavailable, "the memory owner of CUDA device {} keeps dying; it is started again in {} ms",
                 ask.device, ask.owner_restart_delay_ms);
  }
  if (ask.budget != 0 && ask.held + ask.bytes > ask.budget) {
    return Error(Code::kResourceExhausted,
                 "worker {} asked for {} of device memory, beyond the budget of device {} ({}) with "
                 "what it holds already",
                 ask.slot, FormatBytes(ask.bytes), ask.device, FormatBytes(ask.budget));
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor::policy
