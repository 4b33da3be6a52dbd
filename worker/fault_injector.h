// Named fault points in the worker, for the fault-injection harness. Only a daemon started with
// --enable-fault-injection arms any; the supervisor sends the whole armed set to every worker (and to
// each respawned one). A fault fires on its Nth matching hit in this process, tells the supervisor
// (so that it can count shots and disarm it everywhere), then does what its action says.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "ipc/fault_spec.h"
#include "ipc/warmpool.pb.h"

namespace warmpool::worker {

class FaultInjector {
 public:
  // Called just before an action runs, from the thread that hit the point.
  using FiredFn = std::function<void(uint64_t fault_id)>;
  explicit FaultInjector(FiredFn on_fired) : on_fired_(std::move(on_fired)) {}

  // Replaces the armed set; hit counts of faults that stay armed are kept.
  void Set(const v1::WorkerFaultSet& set);
  // A point was reached while working for model (empty when none).
  void Hit(std::string_view point, std::string_view model);

 private:
  struct Armed {
    v1::Fault fault;
    uint32_t hits = 0;
    bool fired = false;
  };
  void Execute(const v1::Fault& fault);

  FiredFn on_fired_;
  std::mutex mutex_;
  std::vector<Armed> armed_;
};

}  // namespace warmpool::worker
