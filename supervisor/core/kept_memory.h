// Memory the core let go of that the shell keeps for the next allocation: on the host backend (one
// device, whose budget it counts against), a memfd region whose pages are allocated and zeroed
// already (weights every replica released, a parked copy unparked or dropped). A load handed one
// of them writes into those pages instead of faulting in fresh ones, which on a VM costs several
// times the copy itself; under a full budget the region a load reuses is the one its eviction
// just freed.
//
// The core decides everything here and the shell only carries it out: what is kept
// (action::CloseHandle::keep), which region a job that allocates is offered
// (action::SendToWorker::offer), and what goes (action::DropKept) so that the device's used bytes
// plus the kept bytes never pass its budget: kept memory is memory the budget promised, not
// extra. Core::CheckInvariants checks that sum, and that no kept region is also a model's, after
// every event the simulator delivers. Bytes are the weights' bytes the core counted for the region
// (the region itself may be up to a page larger).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace warmpool::supervisor {

class KeptMemory {
 public:
  struct Region {
    int handle = -1;
    uint64_t bytes = 0;
  };

  void Keep(int handle, uint64_t bytes) {
    regions_.push_back({handle, bytes});
    bytes_ += bytes;
  }
  // The region for an allocation of `bytes`, taken out: the smallest of at least `bytes`, else
  // the largest (the worker grows it); none when nothing is kept.
  std::optional<Region> Take(uint64_t bytes) {
    if (regions_.empty()) return std::nullopt;
    auto best = regions_.end();
    auto largest = regions_.begin();
    for (auto it = regions_.begin(); it != regions_.end(); ++it) {
      if (it->bytes >= bytes && (best == regions_.end() || it->bytes < best->bytes)) best = it;
      if (it->bytes > largest->bytes) largest = it;
    }
    auto chosen = best != regions_.end() ? best : largest;
    Region region = *chosen;
    bytes_ -= region.bytes;
    regions_.erase(chosen);
    return region;
  }
  // Takes regions out, oldest first, until at most `limit` bytes are kept; their handles.
  std::vector<int> TrimTo(uint64_t limit) {
    std::vector<int> dropped;
    while (bytes_ > limit && !regions_.empty()) {
      bytes_ -= regions_.front().bytes;
      dropped.push_back(regions_.front().handle);
      regions_.pop_front();
    }
    return dropped;
  }

  uint64_t bytes() const { return bytes_; }
  size_t size() const { return regions_.size(); }
  const std::deque<Region>& regions() const { return regions_; }

 private:
  std::deque<Region> regions_;  // oldest first
  uint64_t bytes_ = 0;
};

}  // namespace warmpool::supervisor
