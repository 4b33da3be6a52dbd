// The fixture of ModelIndex's tests (model_index_test.cc, model_index_validate_test.cc): an index
// over a byte vector, and the lifecycle steps the tests walk a record through.
#pragma once

#include "shm/model_index.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <list>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "shm/inflight.h"
#include "shm/segment.h"
#include "tests/text.h"

namespace warmpool::shm {

using Order = std::vector<uint32_t>;

using ::warmpool::testing::Contains;

// The lifecycle steps the tests walk a record through, published the way an owner of the model's
// state does it (ModelIndex::Publish): the record's bytes and device are carried over.
inline ModelIndex::Residency Current(const ModelIndex& index, uint32_t i, ModelState state) {
  const ModelRecord& r = index.Get(i);
  ModelIndex::Residency next;
  next.state = state;
  next.device = r.device;
  next.worker_slot = r.worker_slot;
  next.replicas = r.replicas;
  next.weight_bytes = r.weight_bytes;
  next.workspace_bytes = r.workspace_bytes;
  return next;
}
// Loading on a worker, `bytes` admitted: the registered weights count, and what is above them is
// workspace.
inline void MarkLoading(ModelIndex& index, uint32_t i, uint32_t device, uint32_t worker, uint64_t bytes) {
  ModelIndex::Residency next = Current(index, i, ModelState::kLoading);
  next.device = device;
  next.worker_slot = worker;
  next.replicas = 1;
  next.workspace_bytes = bytes > next.weight_bytes ? bytes - next.weight_bytes : 0;
  index.Publish(i, next);
}
// Ready with what the engine really allocated.
inline void MarkReady(ModelIndex& index, uint32_t i, uint64_t weight_bytes, uint64_t workspace_bytes) {
  ModelIndex::Residency next = Current(index, i, ModelState::kReady);
  next.weight_bytes = weight_bytes;
  next.workspace_bytes = workspace_bytes;
  index.Publish(i, next);
}
inline void MarkUnloading(ModelIndex& index, uint32_t i) {
  index.Publish(i, Current(index, i, ModelState::kUnloading));
}
// Out of residency, registered or failed.
inline void MarkNotResident(ModelIndex& index, uint32_t i, ModelState state, std::string_view error) {
  ModelIndex::Residency next = Current(index, i, state);
  next.worker_slot = kNil;
  next.replicas = 0;
  next.workspace_bytes = 0;
  next.error = error;
  index.Publish(i, next);
}

class ModelIndexTest : public ::testing::Test {
 protected:
  static constexpr Limits kLimits{8, 4, 16};
  static constexpr uint64_t kBudget = 1000;

  ModelIndexTest() : bytes_(SegmentSize(kLimits)), view_(FormatOrDie(bytes_)), index_(view_) {
    for (uint32_t w = 0; w < kLimits.max_workers; w++) {
      view_.worker(w).state = static_cast<uint32_t>(WorkerState::kIdle);
      view_.worker(w).generation = 1;
    }
  }

  static SegmentView FormatOrDie(std::vector<std::byte>& bytes) {
    Result<SegmentView> v = SegmentView::Format(bytes, kLimits, {kBudget, kBudget}, 1);
    if (!v.ok()) {
      ADD_FAILURE() << v.status().ToString();
      return SegmentView();
    }
    return *v;
  }
  uint32_t Reg(const std::string& name, uint64_t weight = 100) {
    Result<uint32_t> r = index_.Register(name, "dense", "/models/" + name, weight);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : kNil;
  }
  // Registered, loaded and ready on device 0 with `weight` bytes.
  uint32_t Ready(const std::string& name, uint64_t weight = 100, uint32_t worker = 0) {
    uint32_t i = Reg(name, weight);
    MarkLoading(index_, i, 0, worker, weight);
    MarkReady(index_, i, weight, 0);
    return i;
  }
  void ExpectValid() {
    Status s = Validate(view_);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  std::string ValidateMessage() {
    Status s = Validate(view_);
    EXPECT_FALSE(s.ok()) << "corruption not detected";
    EXPECT_EQ(s.code(), Code::kInternal);
    return s.message();
  }

  std::vector<std::byte> bytes_;
  SegmentView view_;
  ModelIndex index_;
};

}  // namespace warmpool::shm
