// The in-flight table: fixed slots tagged with (generation | worker slot | state) by compare-and-swap.
// A worker takes a slot when it takes an engine for a request and releases it when it restores the
// engine. If it dies in between, the supervisor reclaims every slot carrying the dead worker's
// (slot, generation): the tag makes a late release by a worker of an older generation a no-op, and
// a reclaim can never free a slot that a respawned worker (new generation) took meanwhile.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "shm/layout.h"
#include "shm/segment.h"

namespace warmpool::shm {

class InflightTable {
 public:
  explicit InflightTable(SegmentView view) : view_(view) {}

  // Worker side. hint spreads workers over the table (e.g. slot * capacity / workers).
  Result<uint32_t> Take(uint32_t generation, uint16_t worker_slot, uint64_t request_id,
                        uint32_t model, uint64_t started_ns, uint32_t hint = 0);
  // False when the slot no longer carries this worker's tag (it was reclaimed).
  bool Release(uint32_t index, uint32_t generation, uint16_t worker_slot);

  // Supervisor side: frees every slot of (worker_slot, generation); returns how many it freed and,
  // when asked, what they held (the requests the dead worker was running).
  uint32_t Reclaim(uint16_t worker_slot, uint32_t generation,
                   std::vector<InflightSlot>* reclaimed = nullptr);
  uint32_t CountTaken() const;
  uint32_t CountTakenBy(uint16_t worker_slot) const;
  uint64_t Tag(uint32_t index) const;

 private:
  SegmentView view_;
};

}  // namespace warmpool::shm
