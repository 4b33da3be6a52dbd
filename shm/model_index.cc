#include "shm/model_index.h"

#include <algorithm>
#include <atomic>
#include <cstring>

namespace warmpool::shm {

namespace {

void CopyName(char* dst, size_t capacity, std::string_view src) {
  size_t n = std::min(src.size(), capacity - 1);
  if (n != 0) std::memcpy(dst, src.data(), n);  // an empty view may have a null data()
  std::memset(dst + n, 0, capacity - n);
}

// Every field but the seqlock, which the writer in progress owns.
void Clear(ModelRecord& r) {
  uint32_t seq = r.seq;
  r = ModelRecord{};
  r.seq = seq;
  r.state = static_cast<uint32_t>(ModelState::kEmpty);
  r.worker_slot = kNil;
  r.lru_prev = r.lru_next = kNil;
}

}  // namespace

std::string_view ModelStateName(ModelState state) {
  switch (state) {
    case ModelState::kEmpty: return "empty";
    case ModelState::kRegistered: return "registered";
    case ModelState::kLoading: return "loading";
    case ModelState::kReady: return "ready";
    case ModelState::kParked: return "parked";
    case ModelState::kFailed: return "failed";
    case ModelState::kUnloading: return "unloading";
  }
  return "unknown";
}

bool IsResident(ModelState state) { return OnDevice(state) || state == ModelState::kParked; }

bool OnDevice(ModelState state) {
  return state == ModelState::kLoading || state == ModelState::kReady ||
         state == ModelState::kUnloading;
}

namespace {

// A record given to another model: its counters start from zero, and the new generation tells a
// reader holding earlier values that they are not this model's (shm/stats.h).
void ResetStats(ModelStats& stats) {
  const uint64_t generation = StatLoad(stats.generation) + 1;
  uint64_t* words = reinterpret_cast<uint64_t*>(&stats);
  for (size_t i = 0; i < sizeof(ModelStats) / sizeof(uint64_t); i++) StatStore(words[i], 0);
  StatStore(stats.generation, generation);
}

}  // namespace

Result<uint32_t> ModelIndex::Register(std::string_view name, std::string_view engine,
                                      std::string_view path, uint64_t weight_bytes) {
  if (name.empty() || name.size() >= sizeof(ModelRecord::name)) {
    return Error(Code::kInvalidArgument, "model name \"{}\" must be 1 to {} bytes", name,
                 sizeof(ModelRecord::name) - 1);
  }
  if (engine.size() >= sizeof(ModelRecord::engine)) {
    return Error(Code::kInvalidArgument, "engine name \"{}\" is longer than {} bytes", engine,
                 sizeof(ModelRecord::engine) - 1);
  }
  if (path.size() >= sizeof(ModelRecord::path)) {
    return Error(Code::kInvalidArgument, "model path \"{}\" is longer than {} bytes", path,
                 sizeof(ModelRecord::path) - 1);
  }
  uint32_t index = Find(name);
  if (index != kNil) {
    if (IsResident(State(index))) {
      return Error(Code::kFailedPrecondition, "model \"{}\" is loaded; unload it before changing it",
                   name);
    }
  } else if (!free_.empty()) {
    index = free_.back();
    free_.pop_back();
    by_name_.emplace(std::string(name), index);
    Update(index, [](ModelRecord& r) { Clear(r); });  // counters start afresh
    ResetStats(view_.model_stats(index));
  } else {
    if (next_free_ >= view_.max_models()) {
      return Error(Code::kResourceExhausted,
                   "the model index is full ({} models): raise [limits] max_models", next_free_);
    }
    index = next_free_++;
    by_name_.emplace(std::string(name), index);
  }
  Update(index, [&](ModelRecord& r) {
    CopyName(r.name, sizeof(r.name), name);
    CopyName(r.engine, sizeof(r.engine), engine);
    CopyName(r.path, sizeof(r.path), path);
    r.state = static_cast<uint32_t>(ModelState::kRegistered);
    r.weight_bytes = weight_bytes;
    r.workspace_bytes = 0;
    r.worker_slot = kNil;
    r.replicas = 0;
    r.last_error[0] = '\0';
  });
  return index;
}

uint32_t ModelIndex::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? kNil : it->second;
}

void ModelIndex::Unregister(uint32_t index) {
  by_name_.erase(std::string(Get(index).name));
  Update(index, [](ModelRecord& r) { Clear(r); });
  free_.push_back(index);
}

std::vector<uint32_t> ModelIndex::All() const {
  std::vector<uint32_t> all;
  all.reserve(next_free_);
  for (uint32_t i = 0; i < next_free_; i++) {
    if (State(i) != ModelState::kEmpty) all.push_back(i);
  }
  return all;
}

void ModelIndex::AddToAccount(uint32_t device, int64_t delta) {
  SeqWrite(view_.header(), [&](SegmentHeader& h) {
    h.device_used_bytes[device] = static_cast<uint64_t>(
        static_cast<int64_t>(h.device_used_bytes[device]) + delta);
  });
}

void ModelIndex::BeginChanges() {
  std::atomic_ref<uint64_t> changes(view_.header().changes);
  changes.store(changes.load(std::memory_order_relaxed) | 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
}

void ModelIndex::EndChanges() {
  std::atomic_ref<uint64_t> changes(view_.header().changes);
  uint64_t now = changes.load(std::memory_order_relaxed);
  if (now & 1) changes.store(now + 1, std::memory_order_release);
}

void ModelIndex::Publish(uint32_t index, const Residency& next) {
  const ModelRecord& r = Get(index);
  auto was = static_cast<ModelState>(r.state);
  int64_t device_before = OnDevice(was) ? static_cast<int64_t>(r.weight_bytes + r.workspace_bytes) : 0;
  // A parked model's workspace is the KV cache kept with its copy (supervisor/core/model.h).
  int64_t parked_before = was == ModelState::kParked ? static_cast<int64_t>(r.weight_bytes + r.workspace_bytes) : 0;
  int64_t device_after = OnDevice(next.state) ? static_cast<int64_t>(next.weight_bytes + next.workspace_bytes) : 0;
  int64_t parked_after =
      next.state == ModelState::kParked ? static_cast<int64_t>(next.weight_bytes + next.workspace_bytes) : 0;
  uint32_t old_device = r.device;
  if (device_before != 0) AddToAccount(old_device, -device_before);
  if (IsResident(was) && !IsResident(next.state)) Unlink(index);
  Update(index, [&](ModelRecord& m) {
    if (next.state == ModelState::kLoading && was != ModelState::kLoading) {
      m.loads++;
      m.loaded_bytes = 0;
    }
    if (next.state == ModelState::kFailed && was != ModelState::kFailed) m.failures++;
    if (next.state == ModelState::kReady) m.loaded_bytes = next.weight_bytes;
    if (!OnDevice(next.state)) m.loaded_bytes = 0;
    m.state = static_cast<uint32_t>(next.state);
    m.device = next.device;
    m.worker_slot = next.worker_slot;
    m.replicas = next.replicas;
    m.weight_bytes = next.weight_bytes;
    m.workspace_bytes = next.workspace_bytes;
    CopyName(m.last_error, sizeof(m.last_error), next.error);
  });
  if (device_after != 0) AddToAccount(next.device, device_after);
  if (parked_after != parked_before) AddToParkAccount(parked_after - parked_before);
  if (!IsResident(was) && IsResident(next.state)) LinkTail(index);
}

void ModelIndex::AddToParkAccount(int64_t delta) {
  SeqWrite(view_.header(), [&](SegmentHeader& h) {
    h.park_used_bytes = static_cast<uint64_t>(static_cast<int64_t>(h.park_used_bytes) + delta);
  });
}

void ModelIndex::SetParkBudget(uint64_t bytes) {
  SeqWrite(view_.header(), [&](SegmentHeader& h) { h.park_budget_bytes = bytes; });
}

void ModelIndex::Touch(uint32_t index) {
  if (!Get(index).in_lru) return;
  Unlink(index);
  LinkTail(index);
}

void ModelIndex::LinkTail(uint32_t index) {
  if (Get(index).in_lru) return;
  SegmentHeader& h = view_.header();
  uint32_t old_tail = h.lru_tail;
  Update(index, [&](ModelRecord& r) {
    r.in_lru = 1;
    r.lru_prev = old_tail;
    r.lru_next = kNil;
  });
  if (old_tail != kNil) Update(old_tail, [&](ModelRecord& r) { r.lru_next = index; });
  SeqWrite(h, [&](SegmentHeader& hh) {
    if (hh.lru_head == kNil) hh.lru_head = index;
    hh.lru_tail = index;
    hh.lru_length++;
  });
}

void ModelIndex::Unlink(uint32_t index) {
  const ModelRecord& r = Get(index);
  if (!r.in_lru) return;
  uint32_t prev = r.lru_prev, next = r.lru_next;
  if (prev != kNil) Update(prev, [&](ModelRecord& p) { p.lru_next = next; });
  if (next != kNil) Update(next, [&](ModelRecord& n) { n.lru_prev = prev; });
  SeqWrite(view_.header(), [&](SegmentHeader& h) {
    if (h.lru_head == index) h.lru_head = next;
    if (h.lru_tail == index) h.lru_tail = prev;
    h.lru_length--;
  });
  Update(index, [&](ModelRecord& m) {
    m.in_lru = 0;
    m.lru_prev = kNil;
    m.lru_next = kNil;
  });
}

std::vector<uint32_t> ModelIndex::LruOrder() const {
  std::vector<uint32_t> order;
  for (uint32_t i = view_.header().lru_head; i != kNil && order.size() <= view_.max_models();
       i = Get(i).lru_next) {
    order.push_back(i);
  }
  return order;
}

}  // namespace warmpool::shm
