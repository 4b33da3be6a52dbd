// Restarts of the supervisor. The shell keeps what the core's action::StoreKept names in the
// service manager's descriptor store (supervisor/warm_store.h), as often as the core sends it, and
// takes a handle out of it before the core's CloseHandle lets the memory go. A SIGKILL can come
// at any moment, so the store a new supervisor gets is the one of the last write, less what was
// closed since: models loaded after it load again, and handles of models whose file changed since
// they were loaded must be refused by the new core. Budgets, capacity and the park budget may
// differ in the configuration the new supervisor reads.
#include <set>
#include <utility>

#include <fmt/format.h>

#include "sim/simulator.h"
#include "supervisor/core/kept.h"

namespace warmpool::sim {

bool Simulator::StoreHoldsKept() const {
  std::set<std::pair<int, bool>> kept, stored;
  for (const supervisor::KeptWeights& k : core_->Kept()) kept.emplace(k.weights.handle, k.parked);
  for (const supervisor::KeptWeights& k : stored_) stored.emplace(k.weights.handle, k.parked);
  return kept == stored;
}

void Simulator::CheckStoreKeepsUp() {
  ticks_since_stored_++;
  ticks_store_behind_ = StoreHoldsKept() ? 0 : ticks_store_behind_ + 1;
  // Counted in ticks the core handled, not in time: a paused supervisor writes nothing either.
  const uint32_t allowed = supervisor::kKeptSyncMs / supervisor::kTickMs + 1;
  if (ticks_store_behind_ > allowed && ticks_since_stored_ > allowed) {
    Fail(fmt::format("the store has held other models than Core::Kept for {} ticks ({} kept, {} stored)",
                     ticks_store_behind_, core_->Kept().size(), stored_.size()));
  }
}

void Simulator::ForgetStored(int handle) {
  std::erase_if(stored_, [&](const supervisor::KeptWeights& k) { return k.weights.handle == handle; });
}

void Simulator::RestartSupervisor() {
  if (stopping_ || failed_) return;
  // A device whose owner is down would have to be found down again by the next supervisor's probe:
  // not simulated, so no restart meanwhile.
  for (bool down : devices_down_) {
    if (down) return;
  }
  // Killed with the store as the core last had it written, or with everything the core holds
  // handed over (as a takeover's hand-over does, supervisor/takeover.h).
  const bool stale = rng_.Chance(700);
  if (!stale && rng_.Chance(2)) {
    // A takeover: the new daemon maps this one's memory, so nothing stays kept for reuse here.
    Deliver(supervisor::event::HandingOver{}, "a takeover");
    if (failed_) return;
    if (!kept_handles_.empty()) return Fail("memory is still kept for reuse after a takeover was accepted");
  }
  if (!stale) stored_ = core_->Kept();
  Trace(fmt::format("== the supervisor is killed{}; the store keeps {} handles",
                    stale ? "" : " just after writing the store", stored_.size()));
  outcome_.restarts++;
  life_++;  // what it had scheduled dies with it
  pending_events_.clear();
  core_.reset();

  // Its workers exit with it (PR_SET_PDEATHSIG); its connections close under their clients.
  for (Worker& w : workers_) {
    w.ForgetProcess();
    w.state = Worker::State::kDown;
  }
  loads_running_.clear();
  for (Client& c : clients_) {
    if (!c.connected) continue;
    c.connected = false;
    c.outstanding.clear();
    c.regions.clear();
    gone_sessions_.insert(c.session);
  }
  stacked_since_ms_ = starved_since_ms_ = 0;
  sent_infers_.clear();

  // Its descriptors close, but for those the store holds: they are the next one's.
  supervisor_handles_.clear();
  kept_handles_.clear();
  for (const supervisor::KeptWeights& k : stored_) {
    if (lost_handles_.count(k.weights.handle) != 0) {
      return Fail(fmt::format("the store holds handle {} of \"{}\", device memory lost with its owner",
                              k.weights.handle, k.name));
    }
    supervisor_handles_.insert(k.weights.handle);
  }

  if (rng_.Chance(400)) {
    // The operator changed the budgets for the next start.
    for (supervisor::DeviceConfig& d : config_.devices) d.budget_bytes = largest_model_ * rng_.Range(1, 4);
    config_.budget_bytes = config_.devices.front().budget_bytes;
    config_.park_budget_bytes = rng_.Chance(400) ? 0 : largest_model_ * rng_.Range(1, 3);
    config_.capacity = rng_.Chance(300) ? static_cast<uint32_t>(rng_.Range(1, 3)) : 0;
    config_.max_cached = rng_.Chance(200) ? static_cast<uint32_t>(rng_.Range(2, 4)) : 0;
    std::string budgets;
    for (const supervisor::DeviceConfig& d : config_.devices) budgets += fmt::format(" {}", d.budget_bytes);
    Trace(fmt::format("== the next start's configuration: budgets{} park {} capacity {} max_cached {}", budgets,
                      config_.park_budget_bytes, config_.capacity, config_.max_cached));
  }
  StartCore(std::exchange(stored_, {}));  // which writes the store anew once it has started
}

void Simulator::CheckAdopted() {
  if (failed_) return;
  outcome_.adopted += core_->adopted();
  const shm::ModelIndex& index = core_->index();
  for (const auto& [model, handle] : core_->HeldHandles()) {
    if (model == shm::kNil) continue;
    const std::string name(index.Get(model).name);
    const SimFile* file = nullptr;
    for (const SimFile& f : files_) {
      if (f.name == name) file = &f;
    }
    const Region& region = regions_[handle];
    if (file == nullptr || region.file != file->id || region.version != file->version || file->broken) {
      return Fail(fmt::format("the new supervisor adopted handle {} (file {} version {}) for \"{}\", whose file "
                              "is now {} version {}{}",
                              handle, region.file, region.version, name, file != nullptr ? file->id : 0,
                              file != nullptr ? file->version : 0,
                              file != nullptr && file->broken ? " and broken" : ""));
    }
    // On the host backend a device region is host memory already: adopted as a parked copy it is one.
    if (index.State(model) == shm::ModelState::kParked) regions_[handle].host = true;
  }
}

}  // namespace warmpool::sim
