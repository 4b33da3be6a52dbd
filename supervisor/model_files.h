// The shell's side of the registry: every read of a model file the supervisor makes (a header at
// registration, start, reload or after a cooldown) and every open it hands a worker, all beneath
// the model roots held as descriptors (supervisor/model_roots.h). The core decides which model is
// looked at when; this class only reads, and answers as events.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"
#include "supervisor/core/actions.h"
#include "supervisor/core/events.h"
#include "supervisor/core/model_entry.h"
#include "supervisor/model_roots.h"

namespace warmpool::supervisor {

class ModelFiles {
 public:
  // The roots (and engine_dir) of `config`: at start, and again after a reload changed them.
  void Configure(const Config& config);
  // The models `config` registers (its [[models]], then the models directory).
  std::vector<ModelEntry> Discover(const Config& config, std::vector<std::string>& warnings) const;
  // `warmpool register`: where the path leads and what its header says; a path refused (outside
  // the roots, not a regular file) is an error, never a failed registration.
  Result<ModelEntry> LookAtRegistration(const v1::RegisterRequest& request) const;
  // action::InspectModel, answered.
  event::ModelInspected Inspect(const action::InspectModel& inspect) const;
  // A load's model file, opened beneath its root and put first among the frame's descriptors.
  // When it cannot be opened, the frame is not to be sent: the returned event ends the load as
  // the worker's failure would.
  std::optional<event::WorkerMessage> OpenFor(action::SendToWorker& send) const;

 private:
  ModelRoots roots_;
  std::string engine_dir_;
  Backend backend_ = Backend::kAuto;  // as resolved at start: where language models' caches live
};

}  // namespace warmpool::supervisor
