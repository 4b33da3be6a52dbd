#include "worker/fault_injector.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <charconv>
#include <cstdlib>
#include <thread>

namespace warmpool::worker {

void FaultInjector::Set(const v1::WorkerFaultSet& set) {
  std::lock_guard lock(mutex_);
  std::vector<Armed> next;
  for (const v1::Fault& f : set.faults()) {
    Armed a{f, 0, false};
    for (const Armed& old : armed_) {
      if (old.fault.id() == f.id()) {
        a.hits = old.hits;
        a.fired = old.fired;
      }
    }
    next.push_back(std::move(a));
  }
  armed_ = std::move(next);
}

void FaultInjector::Hit(std::string_view point, std::string_view model) {
  v1::Fault fire;
  {
    std::lock_guard lock(mutex_);
    if (armed_.empty()) return;
    bool found = false;
    for (Armed& a : armed_) {
      if (a.fired || a.fault.point() != point) continue;
      if (!a.fault.model().empty() && a.fault.model() != model) continue;
      uint32_t after = a.fault.after() == 0 ? 1 : a.fault.after();
      if (++a.hits < after) continue;
      a.fired = true;
      fire = a.fault;
      found = true;
      break;
    }
    if (!found) return;
  }
  on_fired_(fire.id());
  Execute(fire);
}

void FaultInjector::Execute(const v1::Fault& fault) {
  const std::string& action = fault.action();
  uint32_t n = 0;
  if (action == "kill") {
    raise(SIGKILL);
  } else if (action == "segv") {
    volatile int* null = nullptr;
    *null = 1;  // a real invalid access, not a raised signal
  } else if (action == "abort") {
    std::abort();
  } else if (action == "hang") {
    for (;;) pause();
  } else if (action.starts_with("exit:") && ipc::ParseFaultNumber(std::string_view(action).substr(5), n)) {
    _exit(static_cast<int>(n));
  } else if (action.starts_with("delay:") && ipc::ParseFaultNumber(std::string_view(action).substr(6), n)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(n));
  }
}

}  // namespace warmpool::worker
