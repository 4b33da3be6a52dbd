#include "worker/fault_injector.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace warmpool::worker {

JobFaults::JobFaults(const google::protobuf::RepeatedPtrField<v1::Fault>& faults, FiredFn on_fired)
    : faults_(faults.begin(), faults.end()),
      fired_(faults_.size(), false),
      on_fired_(std::move(on_fired)) {}

void JobFaults::Hit(std::string_view point) {
  for (size_t i = 0; i < faults_.size(); i++) {
    if (fired_[i] || faults_[i].point() != point) continue;
    fired_[i] = true;
    if (on_fired_) on_fired_(faults_[i].id());
    Execute(faults_[i]);
  }
}

void JobFaults::Execute(const v1::Fault& fault) {
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
