#include "worker/inflight_marks.h"

#include "common/clock.h"

namespace warmpool::worker {

Status InflightMarks::Attach(shm::SharedSegment segment) {
  segment_ = std::move(segment);
  table_ = std::make_unique<shm::InflightTable>(segment_.view());
  if (slot_ >= segment_.view().max_workers()) {
    return Error(Code::kInvalidArgument, "worker slot {} is outside the segment's {} slots", slot_,
                 segment_.view().max_workers());
  }
  return OkStatus();
}

Result<uint32_t> InflightMarks::Take(uint64_t id, uint32_t model) {
  // The hint starts each worker's search in its own part of the table.
  return table_->Take(generation_, slot_, id, model, UnixNanos(), slot_ * 16);
}

void InflightMarks::Release(uint32_t marker) { table_->Release(marker, generation_, slot_); }

}  // namespace warmpool::worker
