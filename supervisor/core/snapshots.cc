// The read-only views (models, ps, status), built from the index itself so that no parallel copy
// can drift from it.
#include "supervisor/core/core.h"

namespace warmpool::supervisor {

using shm::ModelState;

int64_t Core::RetryInMs(uint32_t model) const {
  if (index_->State(model) != ModelState::kFailed) return 0;
  uint64_t now = MonoMs();
  uint64_t until = runtime_[model].failed_until_ms;
  return until > now ? static_cast<int64_t>(until - now) : 0;
}

v1::Envelope Core::ModelsSnapshot() const {
  v1::Envelope reply;
  v1::ModelsReply* models = reply.mutable_models_reply();
  for (uint32_t i : index_->All()) {
    const shm::ModelRecord& r = index_->Get(i);
    v1::ModelInfo* m = models->add_models();
    m->set_name(r.name);
    m->set_engine(r.engine);
    m->set_path(r.path);
    m->set_state(std::string(shm::ModelStateName(static_cast<ModelState>(r.state))));
    m->set_bytes(r.weight_bytes);
    m->set_last_error(runtime_[i].last_error);
    m->set_retry_in_ms(RetryInMs(i));
    m->set_in_features(runtime_[i].in_features);
    m->set_out_features(runtime_[i].out_features);
  }
  return reply;
}

v1::Envelope Core::PsSnapshot() const {
  v1::Envelope reply;
  v1::PsReply* ps = reply.mutable_ps_reply();
  std::vector<uint32_t> shown = index_->LruOrder();
  for (uint32_t i : index_->All()) {
    if (index_->State(i) == ModelState::kFailed) shown.push_back(i);  // with why and when
  }
  for (uint32_t i : shown) {
    const shm::ModelRecord& r = index_->Get(i);
    v1::PsEntry* e = ps->add_models();
    e->set_last_error(runtime_[i].last_error);
    e->set_retry_in_ms(RetryInMs(i));
    e->set_worker(r.worker_slot == shm::kNil ? -1 : static_cast<int32_t>(r.worker_slot));
    e->set_name(r.name);
    e->set_state(std::string(shm::ModelStateName(static_cast<ModelState>(r.state))));
    e->set_device(r.device);
    e->set_bytes(r.weight_bytes + r.workspace_bytes);
    e->set_inflight(r.inflight);
    e->set_replicas(r.replicas);
    e->set_last_used(static_cast<int64_t>(r.last_used_ns / 1000000000ull));
    uint64_t expires = runtime_[i].expires_at_ms;
    if (expires != 0 && static_cast<ModelState>(r.state) == ModelState::kReady) {
      uint64_t now = MonoMs();
      e->set_has_expiry(true);
      e->set_expires_in(expires > now ? static_cast<int64_t>((expires - now + 999) / 1000) : 0);
    }
    e->set_weight_bytes(r.weight_bytes);
    e->set_pinned(r.pinned != 0);
    e->set_loaded_bytes(r.loaded_bytes);
  }
  return reply;
}

v1::Envelope Core::StatusSnapshot() const {
  v1::Envelope reply;
  v1::StatusReply* status = reply.mutable_status_reply();
  status->set_version(kVersion);
  status->set_backend("host");
  v1::DeviceStatus* device = status->add_devices();
  device->set_id(0);
  device->set_kind("host");
  device->set_budget_bytes(index_->DeviceBudget());
  device->set_used_bytes(index_->DeviceUsed(0));
  for (uint32_t slot = 0; slot < workers_.size(); slot++) {
    const shm::WorkerRecord& w = index_->view().worker(slot);
    v1::WorkerStatus* ws = status->add_workers();
    ws->set_slot(slot);
    ws->set_pid(w.pid);
    ws->set_device(w.device);
    static const char* kStates[] = {"empty", "starting", "idle", "busy", "dead", "fatal"};
    std::string state = w.state < 6 ? kStates[w.state] : "unknown";
    if (state == "idle" && workers_[slot].outstanding != 0) state = "busy";
    ws->set_state(state);
    ws->set_restarts(w.restarts);
    ws->set_last_exit(workers_[slot].last_exit);
  }
  uint32_t inflight = 0;
  for (const auto& [id, job] : jobs_) inflight += job.kind == Job::Kind::kInfer;
  status->set_inflight(inflight);
  status->set_queued(queued_);
  status->set_fault_injection(config_.enable_fault_injection);
  for (uint32_t i : index_->LruOrder()) {
    if (index_->State(i) != ModelState::kLoading) continue;
    v1::PsEntry* e = status->add_loading();
    e->set_name(index_->Get(i).name);
    e->set_state("loading");
    e->set_loaded_bytes(index_->Get(i).loaded_bytes);
    e->set_weight_bytes(index_->Get(i).weight_bytes);
  }
  for (uint32_t i : index_->All()) {
    if (index_->State(i) != ModelState::kFailed) continue;
    v1::ModelInfo* f = status->add_failed();
    f->set_name(index_->Get(i).name);
    f->set_engine(index_->Get(i).engine);
    f->set_path(index_->Get(i).path);
    f->set_state("failed");
    f->set_last_error(runtime_[i].last_error);
    f->set_retry_in_ms(RetryInMs(i));
  }
  return reply;
}

}  // namespace warmpool::supervisor
