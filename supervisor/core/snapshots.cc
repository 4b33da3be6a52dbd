// The read-only views (models, ps, status), built from the index and the machines themselves so
// that no parallel copy can drift from them.
#include <algorithm>

#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using namespace residency;

int64_t Core::RetryInMs(uint32_t model) const {
  const Failed* f = models_[model].machine.As<Failed>();
  if (f == nullptr || f->until_ms <= MonoMs()) return 0;
  return static_cast<int64_t>(f->until_ms - MonoMs());
}

Core::Sizes Core::SizesOf(uint32_t model) const {
  const shm::ModelRecord& r = index_->Get(model);
  const Model& m = models_[model];
  switch (static_cast<shm::ModelState>(r.state)) {
    case shm::ModelState::kLoading:
    case shm::ModelState::kReady:
    case shm::ModelState::kUnloading:
      return Sizes{r.weight_bytes, r.workspace_bytes};  // what it holds of its device now
    case shm::ModelState::kParked:
      // The host copy of its weights, and the KV cache kept with it (a language model's): host memory.
      return Sizes{r.weight_bytes, r.workspace_bytes};
    default:
      // Registered or failed: what a load of it will need (one replica).
      return Sizes{r.weight_bytes, m.entry.workspace_bytes};
  }
}

uint32_t Core::StayingReplicas(uint32_t model) const {
  const std::vector<Replica>* replicas = models_[model].machine.Replicas();
  if (replicas == nullptr) return 0;
  return static_cast<uint32_t>(std::count_if(replicas->begin(), replicas->end(),
                                             [](const Replica& r) { return r.leave_job == 0; }));
}

v1::Envelope Core::LoadReplyFor(uint32_t model, uint32_t asked, const std::string& short_by) const {
  const Model& m = models_[model];
  v1::Envelope reply;
  v1::LoadReply* out = reply.mutable_load_reply();
  out->set_model(m.entry.name);
  const Sizes sizes = SizesOf(model);
  out->set_bytes(sizes.weights);
  out->set_weight_bytes(sizes.weights);
  out->set_workspace_bytes(sizes.workspace);
  const uint32_t replicas = StayingReplicas(model);
  out->set_replicas(replicas);
  out->set_replicas_asked(asked);
  if (asked > replicas) {
    const uint32_t per_device = config_.workers_per_device;
    std::string why;
    if (asked > per_device) {
      why = fmt::format("at most {}: a model's replicas share its weights on one device and each needs a "
                        "worker of its own ([daemon] workers_per_device = {})",
                        per_device, per_device);
    }
    if (replicas < std::min(asked, per_device) && !short_by.empty()) {
      why += (why.empty() ? "" : "; ") + short_by;
    }
    out->set_replicas_capped(why);
  }
  for (const std::string& name : m.evicted_for) out->add_evicted(name);
  return reply;
}

v1::Envelope Core::ModelsSnapshot() const {
  v1::Envelope reply;
  v1::ModelsReply* models = reply.mutable_models_reply();
  for (uint32_t i : index_->All()) {
    const shm::ModelRecord& r = index_->Get(i);
    const Model& m = models_[i];
    v1::ModelInfo* info = models->add_models();
    info->set_name(r.name);
    info->set_engine(r.engine);
    info->set_path(r.path);
    info->set_state(std::string(shm::ModelStateName(static_cast<shm::ModelState>(r.state))));
    const Sizes sizes = SizesOf(i);
    info->set_bytes(sizes.weights);
    info->set_weight_bytes(sizes.weights);
    info->set_workspace_bytes(sizes.workspace);
    info->set_pinned(m.pinned);
    info->set_last_error(m.last_error);
    info->set_retry_in_ms(RetryInMs(i));
    info->set_file_broken(m.file_broken && m.machine.Is<Failed>());
    info->set_in_features(m.entry.in_features);
    info->set_out_features(m.entry.out_features);
    info->set_context(m.entry.context);
    info->set_kv_bytes_per_token(m.entry.kv_bytes_per_token);
    info->set_runs_tensors(m.entry.runs_tensors);
    info->set_tool_call_format(m.tool_call_format);
    info->set_parallel(m.entry.generates() ? std::max<uint32_t>(m.entry.sequences, 1) : 0);
    info->set_kv_cache_tokens(m.entry.generates() ? m.entry.KvCacheTokens() : 0);
    info->set_embeds_only(m.entry.embeds_only);
    for (const v1::NamedTensor& t : m.entry.inputs) *info->add_inputs() = t;
    for (const v1::NamedTensor& t : m.entry.outputs) *info->add_outputs() = t;
  }
  // Models the index had no room for: listed, with why, so that a request for one is not a
  // mystery NOT_FOUND.
  for (const auto& [name, why] : refused_) {
    v1::ModelInfo* info = models->add_models();
    info->set_name(name);
    info->set_state("refused");
    info->set_last_error(why);
  }
  return reply;
}

v1::Envelope Core::PsSnapshot() const {
  v1::Envelope reply;
  v1::PsReply* ps = reply.mutable_ps_reply();
  std::vector<uint32_t> shown = index_->LruOrder();
  for (uint32_t i : index_->All()) {
    if (models_[i].machine.Is<Failed>()) shown.push_back(i);  // with why and when
  }
  for (uint32_t i : shown) {
    const shm::ModelRecord& r = index_->Get(i);
    const Model& m = models_[i];
    v1::PsEntry* e = ps->add_models();
    e->set_last_error(m.last_error);
    e->set_retry_in_ms(RetryInMs(i));
    e->set_file_broken(m.file_broken && m.machine.Is<Failed>());
    e->set_worker(r.worker_slot == shm::kNil ? -1 : static_cast<int32_t>(r.worker_slot));
    e->set_name(r.name);
    e->set_state(std::string(shm::ModelStateName(static_cast<shm::ModelState>(r.state))));
    e->set_device(r.device);
    const Sizes sizes = SizesOf(i);
    e->set_bytes(sizes.weights + sizes.workspace);
    e->set_inflight(m.inflight);
    e->set_replicas(r.replicas);
    e->set_last_used(static_cast<int64_t>(r.last_used_ns / 1000000000ull));
    // A pinned model never expires (PlanExpiry): it shows no countdown.
    if (m.expires_at_ms != 0 && m.machine.Is<Ready>() && !m.pinned) {
      e->set_has_expiry(true);
      e->set_expires_in(m.expires_at_ms > MonoMs()
                            ? static_cast<int64_t>((m.expires_at_ms - MonoMs() + 999) / 1000)
                            : 0);
    }
    e->set_weight_bytes(sizes.weights);
    e->set_workspace_bytes(sizes.workspace);
    e->set_pinned(m.pinned);
    e->set_loaded_bytes(r.loaded_bytes);
    e->set_context(m.entry.context);
    e->set_kv_bytes_per_token(m.entry.kv_bytes_per_token);
    const shm::ModelStats& stats = segment_.model_stats(i);
    e->set_prompt_tokens(shm::StatLoad(stats.prompt_tokens));
    e->set_cached_prompt_tokens(shm::StatLoad(stats.prompt_tokens_cached));
  }
  return reply;
}

v1::Envelope Core::StatusSnapshot() const {
  v1::Envelope reply;
  v1::StatusReply* status = reply.mutable_status_reply();
  status->set_version(kVersion);
  status->set_instance(config_.instance);
  // As resolved at start; a core built from a configuration that was never resolved (the
  // simulator's, some tests') serves from host memory.
  const std::string backend(BackendName(config_.backend == Backend::kCuda ? Backend::kCuda : Backend::kHost));
  status->set_backend(backend);
  for (uint32_t d = 0; d < DeviceCount(); d++) {
    v1::DeviceStatus* device = status->add_devices();
    device->set_id(d);
    device->set_kind(backend);
    device->set_name(config_.devices[d].name);
    device->set_total_bytes(config_.devices[d].total_bytes);
    device->set_budget_bytes(index_->DeviceBudget(d));
    device->set_used_bytes(index_->DeviceUsed(d));
    if (d == 0) {  // only the host backend keeps memory, and it has one device
      device->set_kept_bytes(kept_memory_.bytes());
      device->set_kept_regions(static_cast<uint32_t>(kept_memory_.size()));
    }
  }
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    const WorkerSlot& w = workers_[slot];
    const shm::WorkerRecord& record = segment_.worker(slot);
    v1::WorkerStatus* ws = status->add_workers();
    ws->set_slot(slot);
    ws->set_pid(w.pid);
    ws->set_device(DeviceOf(slot));
    static const char* kStates[] = {"empty", "starting", "idle", "busy", "dead", "fatal"};
    ws->set_state(record.state < 6 ? kStates[record.state] : "unknown");
    ws->set_restarts(w.restarts);
    ws->set_last_exit(w.last_exit);
    ws->set_outstanding(w.outstanding);
    for (uint32_t model : index_->LruOrder()) {
      if (models_[model].machine.HasWorker(slot)) ws->add_models(models_[model].entry.name);
    }
  }
  status->set_inflight(static_cast<uint32_t>(infer_jobs_));
  status->set_queued(queued_);
  status->set_fault_injection(config_.enable_fault_injection);
  for (uint32_t i : index_->LruOrder()) {
    if (index_->State(i) != shm::ModelState::kLoading) continue;
    v1::PsEntry* e = status->add_loading();
    e->set_name(index_->Get(i).name);
    e->set_state("loading");
    e->set_loaded_bytes(index_->Get(i).loaded_bytes);
    e->set_weight_bytes(index_->Get(i).weight_bytes);
  }
  for (uint32_t i : index_->All()) {
    if (!models_[i].machine.Is<Failed>()) continue;
    v1::ModelInfo* f = status->add_failed();
    f->set_name(index_->Get(i).name);
    f->set_engine(index_->Get(i).engine);
    f->set_path(index_->Get(i).path);
    f->set_state("failed");
    f->set_last_error(models_[i].last_error);
    f->set_retry_in_ms(RetryInMs(i));
    f->set_file_broken(models_[i].file_broken);
  }
  return reply;
}

}  // namespace warmpool::supervisor
