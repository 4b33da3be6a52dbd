// Memory the supervisor keeps for reuse (supervisor/core/kept_memory.h), as the shell holds it:
// kept_handles_ are the regions an action::CloseHandle::keep put aside and no offer or DropKept has
// taken yet. The core counts them (Core::CheckInvariants checks that used + kept fits the budget);
// here the two must agree after every event, and an offer or a drop must name a kept region.
#include <set>

#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {

bool Simulator::OfferKept(const supervisor::action::SendToWorker& send) {
  // The region goes to the job: the shell sends the worker its own copy and closes its descriptor;
  // the worker's weights come back as a new handle.
  Trace(fmt::format("<- offer kept handle {} to job {} ({} bytes)", send.offer, send.job, send.allocates));
  if (send.allocates == 0) {
    Fail(fmt::format("kept handle {} offered to a job that allocates nothing", send.offer));
    return false;
  }
  if (kept_handles_.erase(send.offer) == 0) {
    Fail(fmt::format("offered handle {}, which is not kept", send.offer));
    return false;
  }
  return true;
}

void Simulator::DropKept(int handle) {
  Trace(fmt::format("<- drop kept handle {}", handle));
  if (kept_handles_.erase(handle) == 0) Fail(fmt::format("dropped handle {}, which is not kept", handle));
}

void Simulator::CheckKeptMemory() {
  std::set<int> counted;
  for (const supervisor::KeptMemory::Region& r : core_->kept_memory().regions()) counted.insert(r.handle);
  if (counted != kept_handles_) {
    Fail(fmt::format("the shell keeps {} regions, the core counts {}", kept_handles_.size(), counted.size()));
  }
}

}  // namespace warmpool::sim
