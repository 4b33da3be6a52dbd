#include "supervisor/model_files.h"

#include "ipc/error_proto.h"
#include "supervisor/registry.h"

namespace warmpool::supervisor {

void ModelFiles::Configure(const Config& config) {
  roots_ = ModelRoots(EffectiveModelRoots(config));
  engine_dir_ = config.engine_dir;
  backend_ = config.backend;
}

std::vector<ModelEntry> ModelFiles::Discover(const Config& config, std::vector<std::string>& warnings) const {
  return DiscoverModels(config, roots_, warnings);
}

Result<ModelEntry> ModelFiles::LookAtRegistration(const v1::RegisterRequest& request) const {
  ModelEntry entry = InspectModel(request.model(), request.engine(), request.path(), roots_, engine_dir_, backend_);
  if (entry.path_refused) return entry.problem;  // never registered, not even as failed
  return entry;
}

event::ModelInspected ModelFiles::Inspect(const action::InspectModel& inspect) const {
  event::ModelInspected e;
  e.model = inspect.model;
  e.path = inspect.path;
  if (!inspect.path.empty()) e.resolved = roots_.Resolve(inspect.path);
  else e.resolved = std::string();
  e.entry = InspectModel(inspect.name, inspect.engine, inspect.path, roots_, engine_dir_, backend_);
  return e;
}

std::optional<event::WorkerMessage> ModelFiles::OpenFor(action::SendToWorker& send) const {
  Result<ModelFile> file = roots_.OpenResolved(send.model_file);
  if (file.ok()) {
    send.handles.insert(send.handles.begin(), file->Release());
    return std::nullopt;
  }
  // The load ends here, before the worker hears of it (so no memory is offered to it either):
  // the core learns of it as of any load that failed. Any other handle of the frame stays the
  // core's.
  event::WorkerMessage e;
  e.slot = send.slot;
  v1::WorkerLoadDone* done = e.message.mutable_load_done();
  done->set_job(send.job);
  ipc::SetError(done->mutable_error(), file.status());
  return e;
}

}  // namespace warmpool::supervisor
