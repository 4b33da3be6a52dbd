#include "shm/inflight.h"

#include <atomic>

namespace warmpool::shm {

namespace {
std::atomic_ref<uint64_t> TagRef(InflightSlot& slot) { return std::atomic_ref<uint64_t>(slot.tag); }
}  // namespace

Result<uint32_t> InflightTable::Take(uint32_t generation, uint16_t worker_slot,
                                     uint64_t request_id, uint32_t model, uint64_t started_ns,
                                     uint32_t hint) {
  const uint32_t n = view_.max_inflight();
  const uint64_t tag = MakeTag(generation, worker_slot, SlotState::kTaken);
  for (uint32_t k = 0; k < n; k++) {
    uint32_t index = (hint + k) % n;
    InflightSlot& slot = view_.inflight(index);
    uint64_t expected = 0;
    if (TagRef(slot).compare_exchange_strong(expected, tag, std::memory_order_acq_rel)) {
      // Owned from here on; the fields are informational (status, harness dumps).
      slot.request_id = request_id;
      slot.model = model;
      slot.started_ns = started_ns;
      return index;
    }
  }
  return Error(Code::kResourceExhausted,
               "the in-flight table is full ({} slots): raise [limits] max_inflight", n);
}

bool InflightTable::Release(uint32_t index, uint32_t generation, uint16_t worker_slot) {
  if (index >= view_.max_inflight()) return false;
  uint64_t expected = MakeTag(generation, worker_slot, SlotState::kTaken);
  return TagRef(view_.inflight(index)).compare_exchange_strong(expected, 0,
                                                                std::memory_order_acq_rel);
}

uint32_t InflightTable::Reclaim(uint16_t worker_slot, uint32_t generation,
                               std::vector<InflightSlot>* reclaimed) {
  uint32_t freed = 0;
  for (uint32_t i = 0; i < view_.max_inflight(); i++) {
    uint64_t tag = TagRef(view_.inflight(i)).load(std::memory_order_acquire);
    if (tag == 0 || TagWorker(tag) != worker_slot || TagGeneration(tag) != generation) continue;
    // The owner is dead, so the fields are stable: copy them before the slot is free again.
    InflightSlot copy = view_.inflight(i);
    if (TagRef(view_.inflight(i)).compare_exchange_strong(tag, 0, std::memory_order_acq_rel)) {
      freed++;
      if (reclaimed != nullptr) reclaimed->push_back(copy);
    }
  }
  return freed;
}

uint32_t InflightTable::CountTaken() const {
  uint32_t taken = 0;
  for (uint32_t i = 0; i < view_.max_inflight(); i++) taken += Tag(i) != 0;
  return taken;
}

uint32_t InflightTable::CountTakenBy(uint16_t worker_slot) const {
  uint32_t taken = 0;
  for (uint32_t i = 0; i < view_.max_inflight(); i++) {
    uint64_t tag = Tag(i);
    taken += tag != 0 && TagWorker(tag) == worker_slot;
  }
  return taken;
}

uint64_t InflightTable::Tag(uint32_t index) const {
  return TagRef(view_.inflight(index)).load(std::memory_order_acquire);
}

}  // namespace warmpool::shm
