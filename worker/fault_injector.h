// Named fault points in the worker, for the fault-injection harness. Only a daemon started with
// --enable-fault-injection arms any, and it grants them job by job: a job's message carries the
// faults granted to it (the supervisor counts `after` and the shots), and they can fire only while
// that job runs. A fault fires at most once per job, tells the supervisor first (so that the shot
// is spent, not given back), then does what its action says.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include <google/protobuf/repeated_ptr_field.h>

#include "ipc/fault_spec.h"
#include "ipc/warmpool.pb.h"
#include "ipc/worker.pb.h"

namespace warmpool::worker {

class JobFaults {
 public:
  // Called just before an action runs, from the thread that hit the point.
  using FiredFn = std::function<void(uint64_t fault_id)>;
  JobFaults() = default;
  JobFaults(const google::protobuf::RepeatedPtrField<v1::Fault>& faults, FiredFn on_fired);

  // A point of this job was reached.
  void Hit(std::string_view point);

 private:
  static void Execute(const v1::Fault& fault);

  std::vector<v1::Fault> faults_;
  std::vector<bool> fired_;
  FiredFn on_fired_;
};

}  // namespace warmpool::worker
