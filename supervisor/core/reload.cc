// Changes to the registry while serving. `warmpool register` adds (or replaces, or removes) one
// model; SIGHUP reads the model registry again, from the config file and the models directory. Models that
// are new register at once; changed ones re-register once they are no longer resident (a loaded
// one is unloaded when its in-flight work ends, and requests that arrive meanwhile wait and then
// load the new version); removed ones finish the work they have, are unloaded and forgotten
// (new requests for them get NOT_FOUND); loaded unchanged ones keep serving untouched.
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using shm::ModelState;

namespace {

// Same model, as far as serving it goes: the same engine, file and bytes in the header, and the
// same problem if it had one (a broken file that stays broken is left as it is).
bool SameModel(const shm::ModelRecord& record, const std::string& header, uint64_t file_size,
               const std::string& problem, const ModelEntry& entry) {
  return entry.problem.message() == problem && entry.engine == record.engine &&
         entry.path == record.path && entry.header == header && entry.file_size == file_size;
}

}  // namespace

void Core::Reload(event::Reload&& reload) {
  if (stopping_) return;
  if (ready_sent_) actions_.push_back(action::Notify{action::Notify::Kind::kReloading, ""});
  Log(LogLevel::kInfo, "SIGHUP: reloading the model registry");
  {
    Result<Config>& fresh = reload.config;
    if (!fresh.ok()) {
      Log(LogLevel::kError, "reload refused, the registry is unchanged: {}",
          fresh.status().ToString());
      ReloadDone("reload failed: " + fresh.status().message());
      return;
    }
    // Only what makes up the registry changes here; the rest needs a restart.
    config_.models = fresh->models;
    config_.models_dir = fresh->models_dir;
    config_.model_roots = fresh->model_roots;
    config_.keep_alive_ms = fresh->keep_alive_ms;
  }
  std::vector<ModelEntry>& entries = reload.entries;
  for (const std::string& w : reload.warnings) Log(LogLevel::kWarn, "{}", w);

  uint32_t added = 0, changed = 0, removed = 0;
  std::vector<bool> listed(runtime_.size(), false);
  for (const ModelEntry& entry : entries) {
    uint32_t model = index_->Find(entry.name);
    if (model == shm::kNil) {
      if (RegisterModel(entry)) {
        added++;
        listed[index_->Find(entry.name)] = true;
      }
      continue;
    }
    listed[model] = true;
    ModelRuntime& rt = runtime_[model];
    if (rt.registered_by_client) {
      Log(LogLevel::kWarn,
          "model \"{}\" was registered by a client; the configured one is ignored until it is "
          "unregistered",
          entry.name);
      continue;
    }
    if (SameModel(index_->Get(model), rt.header, rt.file_size, rt.registration_problem, entry) &&
        !rt.retiring) {
      // Settings only: they apply to the next request.
      rt.keep_alive_ms = config_.keep_alive_ms;
      for (const ModelConfig& c : config_.models) {
        if (c.name != entry.name) continue;
        if (c.keep_alive_ms != kKeepAliveDefault) rt.keep_alive_ms = c.keep_alive_ms;
        rt.target_replicas = std::max<uint32_t>(1, c.replicas);
      }
      continue;
    }
    changed++;
    rt.next = entry;
    RetireWhenIdle(model);
  }
  for (uint32_t model : index_->All()) {
    if (listed[model] || runtime_[model].registered_by_client) continue;
    removed++;
    runtime_[model].next.reset();
    RetireWhenIdle(model);
  }
  Log(LogLevel::kInfo, "reload: {} model(s) added, {} changed, {} removed; {} registered", added,
      changed, removed, index_->All().size());
  ReloadDone(StatusLine());
}

void Core::ReloadDone(const std::string& status) {
  // READY=1 ends the reload; before the first READY (preload still running) it would announce
  // readiness early: then only the status changes.
  actions_.push_back(action::Notify{
      ready_sent_ ? action::Notify::Kind::kReady : action::Notify::Kind::kStatus, status});
}

void Core::HandleRegister(const Call& call, const v1::RegisterRequest& request,
                          std::optional<Result<ModelEntry>>&& registration) {
  const std::string& name = request.model();  // name and path form: checked by CheckRequest
  uint32_t model = index_->Find(name);
  if (model != shm::kNil && !runtime_[model].registered_by_client) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" comes from the configuration; change it there and "
                                   "reload (systemctl reload warmpool, or SIGHUP)",
                                   name));
  }
  v1::Envelope reply;
  v1::RegisterReply* out = reply.mutable_register_model_reply();
  out->set_model(name);
  if (request.remove()) {
    if (model == shm::kNil || runtime_[model].retiring) {
      return AnswerError(call, Error(Code::kNotFound, "model \"{}\" is not registered", name));
    }
    runtime_[model].next.reset();
    RetireWhenIdle(model);
    out->set_removed(true);
    return Answer(call, std::move(reply));
  }
  // The shell looked at the file (resolved under the model roots, header read) before handing
  // the request on.
  if (!registration) {
    return AnswerError(call, Error(Code::kInternal, "register of \"{}\" came without its file", name));
  }
  if (!registration->ok()) return AnswerError(call, registration->status());
  ModelEntry entry = std::move(registration->value());
  // A client's bad file is refused, not registered as failed: nothing changes on bad input.
  if (!entry.problem.ok()) return AnswerError(call, entry.problem);
  out->set_path(entry.path);
  out->set_weight_bytes(entry.weight_bytes);
  if (model != shm::kNil) {
    runtime_[model].next = entry;
    out->set_replaced(true);
    RetireWhenIdle(model);  // registered_by_client survives: the runtime is kept, not reset
    return Answer(call, std::move(reply));
  }
  if (!RegisterModel(entry)) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "the model index is full ({} models): raise [limits] max_models",
                                   index_->All().size()));
  }
  runtime_[index_->Find(name)].registered_by_client = true;
  Log(LogLevel::kInfo, "model \"{}\" registered by a client from {}", name, entry.path);
  Answer(call, std::move(reply));
}

void Core::RetireWhenIdle(uint32_t model) {
  runtime_[model].retiring = true;
  MaybeRetire(model);
}

// Called from clean stacks only (the status tick, a reload, a request, the end of a request):
// forgetting a model frees its index for reuse, which nothing further up may still hold.
void Core::MaybeRetire(uint32_t model) {
  ModelRuntime& rt = runtime_[model];
  if (!rt.retiring) return;
  if (index_->State(model) == ModelState::kReady) {
    // A removed model first serves the requests it has queued; a changed one stops taking new
    // ones (they wait for the new version) and goes as soon as its in-flight work ends.
    if (!rt.next && !rt.waiters.empty()) return;
    if (!rt.unload_waiters.empty() || !rt.bulk.empty()) return;  // an unload is under way
    StartUnload(model, /*eviction=*/false);  // waits for in-flight requests; comes back here
    return;
  }
  // A reply still on its way (a replica's attach, an unload) names this index: forgetting the
  // model now would hand that reply to whatever model reuses the record.
  for (const auto& [id, job] : jobs_) {
    if (job.model == model) return;
  }
  switch (index_->State(model)) {
    case ModelState::kParked:
      CloseHandle(rt.park_fd);
      rt.park_fd = -1;
      index_->MarkNotResident(model, ModelState::kRegistered, "");
      break;
    case ModelState::kRegistered:
    case ModelState::kFailed:
      // Queued requests of a removed model that is not loaded yet: it loads for them first.
      if (!rt.next && !rt.waiters.empty()) return;
      break;
    default:
      return;  // loading or unloading: the end of that comes back here
  }
  rt.retiring = false;
  if (rt.next) {
    ModelEntry entry = std::move(*rt.next);
    rt.next.reset();
    Log(LogLevel::kInfo, "model \"{}\" re-registered from {}", entry.name, entry.path);
    RegisterModel(entry);
    if (!rt.waiters.empty()) EnsureLoading(model);
    return;
  }
  std::string name = index_->Get(model).name;
  Log(LogLevel::kInfo, "model \"{}\" left the registry", name);
  FailWaiters(model, Error(Code::kNotFound, "model \"{}\" was removed from the registry", name));
  index_->Unregister(model);
  runtime_[model] = ModelRuntime{};
}

}  // namespace warmpool::supervisor
