// Changes to the registry while serving. `warmpool register` adds (or replaces, or removes) one
// model; SIGHUP reads the registry again (the shell reads the files and hands the entries over).
// New models register at once; changed ones stop taking requests (they wait) and are let go as
// soon as their requests in flight end, then the new version registers; removed ones finish the
// requests they have, are let go and forgotten (new requests get NOT_FOUND); loaded unchanged
// ones keep serving untouched. Re-registering or forgetting happens after the event
// (ProcessRetirements), when nothing up the stack still holds the model.
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

namespace {

// Same model, as far as serving it goes: the same engine, path and version of the file (a
// retrained model of the same architecture has the same header and size, but not the same
// version: common/file_version.h), and the same problem if it had one (a broken file that stays
// broken is left as it is). The registered entry keeps the problem it was registered with; only
// its file's description follows the file (FollowFile, when a load read a newer version).
bool SameModel(const ModelEntry& registered, const ModelEntry& entry) {
  return entry.problem.message() == registered.problem.message() &&
         entry.engine == registered.engine &&
         entry.path == registered.path && entry.header == registered.header &&
         entry.file_size == registered.file_size && entry.version == registered.version;
}

}  // namespace

void Core::ApplySettings(Model& m) {
  m.keep_alive_ms = config_.keep_alive_ms;
  m.target_replicas = 1;
  m.max_batch_delay_us = config_.max_batch_delay_us;
  m.tool_call_format = m.entry.tool_call_format;
  m.parallel = 0;
  m.kv_cache_tokens = 0;
  float prefill_stretch = 0;
  for (const ModelConfig& c : config_.models) {
    if (c.name != m.entry.name) continue;
    if (c.keep_alive_ms != kKeepAliveDefault) m.keep_alive_ms = c.keep_alive_ms;
    if (!c.tool_call_format.empty()) m.tool_call_format = c.tool_call_format == "none" ? "" : c.tool_call_format;
    m.target_replicas = std::max<uint32_t>(1, c.replicas);
    if (c.max_batch_delay_us >= 0) m.max_batch_delay_us = static_cast<uint32_t>(c.max_batch_delay_us);
    m.parallel = c.parallel;
    m.kv_cache_tokens = c.kv_cache_tokens;
    prefill_stretch = c.prefill_stretch;
  }
  // Not counted by admission: the next load asks its engine for it (a replica attaching opens with
  // its weights' own, as the load that described them).
  m.entry.prefill_stretch = prefill_stretch;
  // Admission counts the KV cache a replica's engine keeps: a whole context per generation it runs
  // at once (as many as configured, else as registration counted: the engine's default), or the
  // positions configured for them to share (kv_cache_tokens: at least one context, at most all of
  // theirs, as the engine keeps it). The entry's counts and its workspace go together (a worker's
  // report sets them all), so the cache's bytes are moved with them. A load asks the engine for
  // exactly the entry's (StartLoad); an engine that keeps another (fewer sequences than asked, its
  // cache in whole blocks) reports so, and the entry follows it until the settings change: applied again
  // unchanged (a reload), they leave the engine's figures alone.
  ModelEntry& e = m.entry;
  const uint32_t wanted = m.parallel != 0 ? m.parallel : m.registered_sequences;
  const uint64_t kv_tokens =
      m.kv_cache_tokens == 0 ? 0 : std::clamp<uint64_t>(m.kv_cache_tokens, e.context, uint64_t{wanted} * e.context);
  if (e.generates() && e.sequences != 0 && wanted != 0 &&
      (wanted != m.sequences_applied || kv_tokens != m.kv_cache_tokens_applied)) {
    const uint64_t before = e.KvCacheTokens() * e.kv_bytes_per_token;
    e.sequences = wanted;
    e.kv_tokens = kv_tokens;
    e.workspace_bytes = e.workspace_bytes - std::min(e.workspace_bytes, before) + e.KvCacheTokens() * e.kv_bytes_per_token;
    m.sequences_applied = wanted;
    m.kv_cache_tokens_applied = kv_tokens;
  }
}

bool Core::RegisterModel(const ModelEntry& entry) {
  Result<uint32_t> index = index_->Register(entry.name, entry.engine, entry.path, entry.weight_bytes);
  if (!index.ok()) {
    Log(LogLevel::kWarn, "model \"{}\" not registered: {}", entry.name, index.status().ToString());
    std::erase_if(refused_, [&](const auto& r) { return r.first == entry.name; });
    refused_.emplace_back(entry.name, index.status().message());
    return false;
  }
  std::erase_if(refused_, [&](const auto& r) { return r.first == entry.name; });
  Model& m = models_[*index];
  m.epoch = ++epochs_;
  m.entry = entry;
  m.refused = !entry.path_refused ? OkStatus()
                                  : Error(Code::kFailedPrecondition,
                                          "model \"{}\" cannot be loaded: {} (fix it, then reload: "
                                          "systemctl reload warmpool, or SIGHUP)",
                                          entry.name, entry.problem.message());
  m.registered_sequences = entry.sequences;
  m.sequences_applied = entry.sequences;
  m.kv_cache_tokens_applied = entry.kv_tokens;
  m.crashes = {};
  m.last_error.clear();
  m.file_broken = false;
  ApplySettings(m);
  m.machine.SetRegisteredBytes(entry.weight_bytes);
  if (!entry.problem.ok()) {
    Log(LogLevel::kWarn, "model \"{}\" registered as failed: {}", entry.name, entry.problem.ToString());
    m.last_error = entry.problem.message();
    m.file_broken = entry.problem_in_file;
    m.machine.Fail(0, entry.problem.message());  // the next request looks at the file again
  } else if (m.machine.Is<Failed>()) {
    m.machine.Recover();
  }
  return true;
}

void Core::Retire(uint32_t model, std::optional<ModelEntry> next) {
  Model& m = models_[model];
  // Changed, then removed before the new version registered: the requests waiting wait for a
  // version that will never come, and the one leaving (it serves a removed model's requests) is
  // older than what the registry held when they came. They end here; what runs finishes.
  if (!next && m.retiring && m.retiring->has_value()) {
    FailWaiters(model, Error(Code::kNotFound, "model \"{}\" was removed from the registry", m.entry.name));
  }
  m.retiring = std::move(next);
}

void Core::ProcessRetirements() {
  for (uint32_t model : index_->All()) {
    Model& m = models_[model];
    if (!m.retiring) continue;
    const bool removed = !m.retiring->has_value();
    if (m.machine.Is<Ready>()) {
      // A removed model first serves the requests it has; a changed one stops taking new ones
      // (they wait for the new version) and goes as soon as its in-flight work ends.
      if (removed && (!m.waiters.empty() || m.inflight != 0)) continue;
      Release(model, shm::ReleaseReason::kReload, /*allow_park=*/false,
              removed ? "no longer registered" : "its registration changed");
      continue;
    }
    if (m.machine.Is<Parked>()) {  // a copy of what is leaving
      DropParked(model, shm::ReleaseReason::kReload, removed ? "no longer registered" : "its registration changed");
    }
    if (!m.machine.Is<Absent>() && !m.machine.Is<Failed>()) continue;  // its end comes back here
    // Requests queued for a removed model that is not loaded: it loads for them first.
    if (removed && !m.waiters.empty()) continue;
    if (!removed) {
      ModelEntry entry = std::move(**m.retiring);
      m.retiring.reset();
      Log(LogLevel::kInfo, "model \"{}\" re-registered from {}", entry.name, entry.path);
      RegisterModel(entry);
      if (!m.waiters.empty()) TryAdmit(model);
      continue;
    }
    std::string name = m.entry.name;
    Log(LogLevel::kInfo, "model \"{}\" left the registry", name);
    FailWaiters(model, Error(Code::kNotFound, "model \"{}\" was removed from the registry", name));
    std::erase(pending_admission_, model);
    std::erase(preloading_, model);
    index_->Unregister(model);
    models_[model] = Model{};
    models_[model].machine.Bind(index_.get(), model);
  }
}

void Core::Reload(event::Reload&& reload) {
  if (stopping_) return;
  if (ready_sent_) actions_.push_back(action::Notify{action::Notify::Kind::kReloading, ""});
  Log(LogLevel::kInfo, "SIGHUP: reloading the model registry");
  if (!reload.config.ok()) {
    Log(LogLevel::kError, "reload refused, the registry is unchanged: {}",
        reload.config.status().ToString());
    return ReloadDone("reload failed: " + reload.config.status().message());
  }
  TakeRegistrySettings(config_, *reload.config);  // the rest needs a restart
  for (const std::string& w : reload.warnings) Log(LogLevel::kWarn, "{}", w);

  uint32_t added = 0, changed = 0, removed = 0;
  std::vector<bool> listed(models_.size(), false);
  for (const ModelEntry& entry : reload.entries) {
    uint32_t model = index_->Find(entry.name);
    if (model == shm::kNil) {
      if (RegisterModel(entry)) {
        added++;
        listed[index_->Find(entry.name)] = true;
      }
      continue;
    }
    listed[model] = true;
    Model& m = models_[model];
    if (m.registered_by_client) {
      Log(LogLevel::kWarn,
          "model \"{}\" was registered by a client; the configured one is ignored until it is "
          "unregistered",
          entry.name);
      continue;
    }
    if (SameModel(m.entry, entry) && !m.retiring) {
      ApplySettings(m);  // settings only: they apply to the next request
      m.entry.from_models_dir = entry.from_models_dir;
      continue;
    }
    changed++;
    Retire(model, entry);
  }
  for (uint32_t model : index_->All()) {
    if (listed[model] || models_[model].registered_by_client) continue;
    removed++;
    Retire(model, std::nullopt);
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
  if (model != shm::kNil && !models_[model].registered_by_client) {
    const ModelEntry& owner = models_[model].entry;
    if (owner.from_models_dir) {
      return AnswerError(call, Error(Code::kFailedPrecondition,
                                     "model \"{}\" comes from the models directory ({}); replace or "
                                     "remove that file and reload (systemctl reload warmpool, or "
                                     "SIGHUP), or register this file under another name",
                                     name, owner.path));
    }
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" comes from the configuration ([[models]] in the config "
                                   "file); change it there and reload (systemctl reload warmpool, or "
                                   "SIGHUP), or register this file under another name",
                                   name));
  }
  v1::Envelope reply;
  v1::RegisterReply* out = reply.mutable_register_model_reply();
  out->set_model(name);
  if (request.remove()) {
    if (model == shm::kNil || (models_[model].retiring && !*models_[model].retiring)) {
      return AnswerError(call, Error(Code::kNotFound, "model \"{}\" is not registered", name));
    }
    Retire(model, std::nullopt);
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
    Retire(model, entry);  // registered_by_client stays: the model is kept, not reset
    out->set_replaced(true);
    return Answer(call, std::move(reply));
  }
  if (!RegisterModel(entry)) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "the model index is full ({} models): raise [limits] max_models",
                                   index_->All().size()));
  }
  models_[index_->Find(name)].registered_by_client = true;
  Log(LogLevel::kInfo, "model \"{}\" registered by a client from {}", name, entry.path);
  Answer(call, std::move(reply));
}

}  // namespace warmpool::supervisor
