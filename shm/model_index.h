// The model index: records in the segment, an O(1) LRU list of the resident entries linked by
// indices, and the per-device byte accounts. The supervisor is its only writer; every mutation goes
// through a seqlock so that observers (status readers, the chaos harness) never see half a record.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "shm/layout.h"
#include "shm/seqlock.h"
#include "shm/segment.h"

namespace warmpool::shm {

std::string_view ModelStateName(ModelState state);
// True for the states that sit in the LRU list (cached: on a device, or parked).
bool IsResident(ModelState state);
// True for the states whose bytes are accounted on a device (not parked).
bool OnDevice(ModelState state);

class ModelIndex {
 public:
  explicit ModelIndex(SegmentView view) : view_(view) {}

  // Adds a model, or updates engine/path/bytes of a registered one that is not resident.
  Result<uint32_t> Register(std::string_view name, std::string_view engine, std::string_view path,
                            uint64_t weight_bytes);
  // kNil when unknown.
  uint32_t Find(std::string_view name) const;
  // Forgets a model that is not resident; its record is reused by a later Register.
  void Unregister(uint32_t index);
  // Direct reads are safe in the writer's own process.
  const ModelRecord& Get(uint32_t index) const { return view_.model(index); }
  ModelState State(uint32_t index) const { return static_cast<ModelState>(Get(index).state); }
  std::vector<uint32_t> All() const;  // every registered index, in index order

  template <typename Fn>
  void Update(uint32_t index, Fn&& fn) {
    SeqWrite(view_.model(index), std::forward<Fn>(fn));
  }

  // Brackets a batch of writes that belong together (SegmentHeader::changes).
  void BeginChanges();
  void EndChanges();

  // What a record shows of a model's residency. Publish() writes it and moves the bytes between
  // the accounts (device, park) and the record in or out of the LRU list to match: the record is
  // derived from the owner's state, never kept beside it.
  struct Residency {
    ModelState state = ModelState::kRegistered;
    uint32_t device = 0;
    uint32_t worker_slot = kNil;
    uint32_t replicas = 0;
    uint64_t weight_bytes = 0;
    uint64_t workspace_bytes = 0;
    std::string_view error;
  };
  void Publish(uint32_t index, const Residency& residency);

  uint64_t ParkUsed() const { return view_.header().park_used_bytes; }
  uint64_t ParkBudget() const { return view_.header().park_budget_bytes; }
  void SetParkBudget(uint64_t bytes);

  // Most recently used moves to the tail.
  void Touch(uint32_t index);
  std::vector<uint32_t> LruOrder() const;  // least recently used first
  uint32_t ResidentCount() const { return view_.header().lru_length; }

  uint64_t DeviceUsed(uint32_t device) const { return view_.header().device_used_bytes[device]; }
  uint64_t DeviceBudget(uint32_t device) const { return view_.header().device_budget_bytes[device]; }
  uint32_t DeviceCount() const { return view_.header().device_count; }
  const SegmentView& view() const { return view_; }

 private:
  void LinkTail(uint32_t index);
  void Unlink(uint32_t index);
  void AddToAccount(uint32_t device, int64_t delta);
  void AddToParkAccount(int64_t delta);

  SegmentView view_;
  std::unordered_map<std::string, uint32_t> by_name_;
  uint32_t next_free_ = 0;
  std::vector<uint32_t> free_;  // unregistered records below next_free_
};

// Every invariant of the segment that a reader can check: LRU consistency (exactly the resident
// entries, no cycle, links agree), byte accounting per device, budgets, and no in-flight slot
// tagged by a worker generation that is not the live one of its slot. Works on any view,
// read-only, so the harness can run it from outside the supervisor.
Status Validate(const SegmentView& view);

}  // namespace warmpool::shm
