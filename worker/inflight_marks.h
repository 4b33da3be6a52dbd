// This worker's in-flight markers in the shared segment. A marker is taken before a job touches an
// engine and released before its reply is sent: if the process dies in between, the supervisor
// finds the markers tagged with this (slot, generation) and so learns which requests and jobs were
// running. Both threads take markers; the table claims its slots atomically in the segment, so
// nothing here needs a lock.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "shm/inflight.h"
#include "shm/segment.h"

namespace warmpool::worker {

class InflightMarks {
 public:
  InflightMarks(uint32_t slot, uint32_t generation) : slot_(slot), generation_(generation) {}

  // Takes over the segment (Worker::Start, before either thread runs); refuses a slot outside it.
  Status Attach(shm::SharedSegment segment);
  // id: the request's id for an inference, the job's for anything else.
  Result<uint32_t> Take(uint64_t id, uint32_t model);
  void Release(uint32_t marker);

 private:
  const uint32_t slot_;
  const uint32_t generation_;
  shm::SharedSegment segment_;
  std::unique_ptr<shm::InflightTable> table_;
};

// The marker of a job other than inference (load, attach, unload, park), held while the job runs
// and released before its reply is sent (reset the optional it lives in).
class JobMark {
 public:
  JobMark(InflightMarks& marks, uint64_t job, uint32_t model) : marks_(marks), marker_(marks.Take(job, model)) {}
  ~JobMark() {
    if (marker_.ok()) marks_.Release(*marker_);
  }
  JobMark(const JobMark&) = delete;
  JobMark& operator=(const JobMark&) = delete;

 private:
  InflightMarks& marks_;
  Result<uint32_t> marker_;
};

}  // namespace warmpool::worker
