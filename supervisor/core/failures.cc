// Failure: a model that crashed its worker too often, or whose file is broken, is marked failed
// with a cooldown; what requests are told says when it is retried, or, when retrying the same file
// cannot help, what to fix and what reads it again.
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::ChargeCrash(uint32_t model, const std::string& why, bool alone) {
  Model& m = models_[model];
  shm::StatAdd(segment_.model_stats(model).crashes_charged);
  size_t crashes = m.crashes.times_ms.size() + 1;
  if (!policy::ChargeCrash(m.crashes, MonoMs(), RetrySettings(), alone)) return;
  MarkFailed(model, fmt::format("crashed its worker {} times within {} s (last: {})", crashes,
                                config_.crash_loop_window_ms / 1000, why));
}

bool IsFileProblem(const Status& cause) {
  // What the engines and the registry say of a file's contents (InvalidArgument: "model file
  // ...: ..."), of a file that is not there, or that may not be read.
  return cause.code() == Code::kInvalidArgument || cause.code() == Code::kNotFound ||
         cause.code() == Code::kPermissionDenied;
}

std::string Core::FileFix(uint32_t model) const {
  const Model& m = models_[model];
  return fmt::format("its file is broken, so retrying it unchanged cannot help: fix or replace {}, then "
                     "run 'warmpool load {}' to read it again{}",
                     m.entry.path.empty() ? std::string("it") : m.entry.path, m.entry.name,
                     m.registered_by_client ? fmt::format(" (or 'warmpool register {} PATH')", m.entry.name)
                                            : std::string(" (a reload, SIGHUP, reads it too)"));
}

void Core::MarkFailed(uint32_t model, const std::string& reason, bool file_broken) {
  Model& m = models_[model];
  uint64_t cooldown = policy::NextCooldown(m.crashes, RetrySettings());
  uint64_t until = MonoMs() + cooldown;
  m.last_error = reason;
  m.file_broken = file_broken;
  m.evicted_for.clear();  // told to no one: a later load of it did not evict them
  // A broken file keeps its cooldown (a request after it reads the file again, one at a time), but
  // nobody is told it "will be retried": unchanged, it fails the same way.
  if (file_broken) {
    Log(LogLevel::kWarn, "model \"{}\" failed: {}; {}", m.entry.name, reason, FileFix(model));
  } else {
    Log(LogLevel::kWarn, "model \"{}\" failed: {}; retried in {} ms at the earliest", m.entry.name,
        reason, cooldown);
  }
  // Those waiting are told first: nothing must load it again on their behalf. Unless a reload
  // replaced the version that failed: they wait for the new one, registered after this event.
  if (!m.changing()) {
    FailWaiters(model, file_broken ? Error(Code::kFailedPrecondition, "model \"{}\" failed: {}; {}",
                                           m.entry.name, reason, FileFix(model))
                                   : Error(Code::kFailedPrecondition,
                                           "model \"{}\" failed: {}; it will be retried in {:.1f} s (or "
                                           "retry now with 'warmpool load {}')",
                                           m.entry.name, reason, cooldown / 1000.0, m.entry.name));
  }
  // Still resident (its weights survived the crash): let them go; it ends failed.
  if (m.machine.Is<Ready>()) Release(model, shm::ReleaseReason::kFailure, /*allow_park=*/false, "it failed");
  if (m.machine.Is<Parked>()) DropParked(model, shm::ReleaseReason::kFailure, "it failed");
  if (m.machine.Is<Loading>() || m.machine.Is<Unparking>()) return;  // its end decides
  m.machine.Fail(until, reason);
}

Status Core::FailedStatus(uint32_t model) const {
  const std::string& name = models_[model].entry.name;
  if (models_[model].file_broken) {
    return Error(Code::kFailedPrecondition, "model \"{}\" failed: {}; {}", name, models_[model].last_error,
                 FileFix(model));
  }
  int64_t retry = RetryInMs(model);
  return Error(Code::kFailedPrecondition,
               "model \"{}\" failed: {}; {} (or retry now with 'warmpool load {}')", name,
               models_[model].last_error,
               retry > 0 ? fmt::format("it will be retried in {:.1f} s", retry / 1000.0)
                         : std::string("the next request retries it"),
               name);
}

}  // namespace warmpool::supervisor
