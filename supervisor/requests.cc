// Client requests: validation, replies, and the read-only snapshots (models, ps, status), which are
// built from the index itself so that no parallel copy can drift from it.
#include <spdlog/spdlog.h>

#include "common/clock.h"
#include "ipc/framing.h"
#include "supervisor/daemon.h"

namespace warmpool::supervisor {

using shm::ModelState;

void Daemon::Answer(const Call& call, v1::Envelope&& reply) {
  reply.set_request_id(call.request_id);
  server_->Send(call.session, reply);
}

void Daemon::AnswerError(const Call& call, const Status& status) {
  Answer(call, ErrorReply(call.request_id, status));
}

void Daemon::OnRequest(uint64_t session, v1::Envelope&& request) {
  Call call{session, request.request_id()};
  if (request.protocol_version() != 0 && request.protocol_version() != ipc::kProtocolVersion) {
    AnswerError(call, Error(Code::kFailedPrecondition,
                            "client speaks protocol version {}, this daemon speaks {}: use a "
                            "client of the same release",
                            request.protocol_version(), ipc::kProtocolVersion));
    return;
  }
  if (stopping_) {
    AnswerError(call, Error(Code::kUnavailable, "the daemon is stopping; retry after it restarts"));
    return;
  }
  switch (request.body_case()) {
    case v1::Envelope::kLoad: HandleLoad(call, request.load().model()); break;
    case v1::Envelope::kUnload: HandleUnload(call, request.unload().model()); break;
    case v1::Envelope::kInfer: HandleInfer(call, std::move(*request.mutable_infer())); break;
    case v1::Envelope::kModels: Answer(call, ModelsSnapshot()); break;
    case v1::Envelope::kPs: Answer(call, PsSnapshot()); break;
    case v1::Envelope::kStatus: Answer(call, StatusSnapshot()); break;
    default:
      AnswerError(call, Error(Code::kInvalidArgument,
                              "request {} carries no request this daemon understands (body {})",
                              request.request_id(), static_cast<int>(request.body_case())));
  }
}

namespace {

Status UnknownModel(const std::string& name) {
  return Error(Code::kNotFound, "model \"{}\" is not registered (see 'warmpool models')", name);
}

}  // namespace

void Daemon::HandleLoad(const Call& call, const std::string& name) {
  uint32_t model = index_->Find(name);
  if (model == shm::kNil) return AnswerError(call, UnknownModel(name));
  if (index_->State(model) == ModelState::kReady) {
    index_->Touch(model);
    v1::Envelope reply;
    reply.mutable_load_reply()->set_model(name);
    reply.mutable_load_reply()->set_bytes(index_->Get(model).weight_bytes);
    reply.mutable_load_reply()->set_already_loaded(true);
    return Answer(call, std::move(reply));
  }
  if (queued_ >= config_.max_queue) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "{} requests are already waiting: retry later", queued_));
  }
  runtime_[model].waiters.push_back(Waiter{call, false, {}, 0});
  queued_++;
  EnsureLoading(model);
}

void Daemon::HandleUnload(const Call& call, const std::string& name) {
  uint32_t model = index_->Find(name);
  if (model == shm::kNil) return AnswerError(call, UnknownModel(name));
  switch (index_->State(model)) {
    case ModelState::kReady:
      runtime_[model].unload_waiters.push_back(call);
      StartUnload(model, /*eviction=*/false);
      return;
    case ModelState::kUnloading:
      runtime_[model].unload_waiters.push_back(call);
      return;
    case ModelState::kLoading:
      return AnswerError(call, Error(Code::kFailedPrecondition,
                                     "model \"{}\" is loading; unload it once it is ready", name));
    default:
      return AnswerError(call, Error(Code::kFailedPrecondition,
                                     "model \"{}\" is not loaded (see 'warmpool ps')", name));
  }
}

void Daemon::HandleInfer(const Call& call, v1::InferRequest&& request) {
  const v1::Tensor& input = request.input();
  if (input.rows() == 0 || input.cols() == 0 ||
      input.data().size() != uint64_t{input.rows()} * input.cols() * sizeof(float)) {
    return AnswerError(call, Error(Code::kInvalidArgument,
                                   "input must be a non-empty rows x cols matrix of f32 (got {} x "
                                   "{} with {} bytes)",
                                   input.rows(), input.cols(), input.data().size()));
  }
  uint32_t model = index_->Find(request.model());
  if (model == shm::kNil) return AnswerError(call, UnknownModel(request.model()));
  if (queued_ >= config_.max_queue) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "{} requests are already waiting (limit {}): retry later",
                                   queued_, config_.max_queue));
  }
  uint32_t deadline = request.deadline_ms() != 0 ? request.deadline_ms() : config_.default_deadline_ms;
  Waiter waiter{call, true, std::move(request), MonotonicMillis() + deadline};
  if (index_->State(model) == ModelState::kReady && !runtime_[model].unload_when_idle) {
    Dispatch(model, std::move(waiter));
    return;
  }
  runtime_[model].waiters.push_back(std::move(waiter));
  queued_++;
  EnsureLoading(model);
}

v1::Envelope Daemon::ModelsSnapshot() const {
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
    m->set_in_features(runtime_[i].in_features);
    m->set_out_features(runtime_[i].out_features);
  }
  return reply;
}

v1::Envelope Daemon::PsSnapshot() const {
  v1::Envelope reply;
  v1::PsReply* ps = reply.mutable_ps_reply();
  for (uint32_t i : index_->LruOrder()) {
    const shm::ModelRecord& r = index_->Get(i);
    v1::PsEntry* e = ps->add_models();
    e->set_name(r.name);
    e->set_state(std::string(shm::ModelStateName(static_cast<ModelState>(r.state))));
    e->set_device(r.device);
    e->set_bytes(r.weight_bytes + r.workspace_bytes);
    e->set_inflight(r.inflight);
    e->set_replicas(r.replicas);
    e->set_last_used(static_cast<int64_t>(r.last_used_ns / 1000000000ull));
    e->set_has_expiry(false);  // no keep_alive yet: kept until evicted
    e->set_loaded_bytes(r.loaded_bytes);
  }
  return reply;
}

v1::Envelope Daemon::StatusSnapshot() const {
  v1::Envelope reply;
  v1::StatusReply* status = reply.mutable_status_reply();
  status->set_version(kVersion);
  status->set_backend("host");
  v1::DeviceStatus* device = status->add_devices();
  device->set_id(0);
  device->set_kind("host");
  device->set_budget_bytes(index_->DeviceBudget());
  device->set_used_bytes(index_->DeviceUsed(0));
  for (uint32_t slot = 0; slot < workers_->size(); slot++) {
    const shm::WorkerRecord& w = segment_.view().worker(slot);
    v1::WorkerStatus* ws = status->add_workers();
    ws->set_slot(slot);
    ws->set_pid(w.pid);
    ws->set_device(w.device);
    static const char* kStates[] = {"empty", "starting", "idle", "busy", "dead", "fatal"};
    std::string state = w.state < 6 ? kStates[w.state] : "unknown";
    if (state == "idle" && worker_outstanding_[slot] != 0) state = "busy";
    ws->set_state(state);
    ws->set_restarts(w.restarts);
  }
  uint32_t inflight = 0;
  for (const auto& [id, job] : jobs_) inflight += job.kind == Job::Kind::kInfer;
  status->set_inflight(inflight);
  status->set_queued(queued_);
  return reply;
}

}  // namespace warmpool::supervisor
