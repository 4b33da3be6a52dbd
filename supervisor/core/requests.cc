// Client requests: validation and replies. What they set in motion lives in lifecycle.cc (loads,
// unloads, admission) and dispatch.cc (inference).
#include <algorithm>
#include <vector>

#include "supervisor/core/core.h"
#include "supervisor/core/request_check.h"

namespace warmpool::supervisor {

using shm::ModelState;

void Core::Answer(const Call& call, v1::Envelope&& reply) {
  reply.set_request_id(call.request_id);
  auto it = sessions_.find(call.session);
  if (it == sessions_.end()) return;  // gone (or the preload, session 0): nobody to tell
  if (it->second > 0) {
    it->second--;
    unanswered_--;
  }
  actions_.push_back(action::Reply{call.session, std::move(reply)});
}

void Core::AnswerError(const Call& call, const Status& status) {
  Answer(call, ErrorReply(call.request_id, status));
}

void Core::OnRequest(event::ClientRequest&& event) {
  v1::Envelope& request = event.envelope;
  Call call{event.session, request.request_id()};
  sessions_[event.session]++;
  unanswered_++;
  bool admin_request = request.has_load() || request.has_unload() || request.has_pin() ||
                       request.has_fault_arm() || request.has_fault_clear() ||
                       request.has_register_model();
  if (admin_request && !event.admin) {
    AnswerError(call, Error(Code::kPermissionDenied,
                            "uid {} may infer and read status, not register, load, unload, pin or "
                            "arm faults: "
                            "run as root or the daemon's user{}",
                            event.uid,
                            config_.admin_group.empty()
                                ? std::string(", or set [access] admin_group")
                                : fmt::format(", or join group {}", config_.admin_group)));
    return;
  }
  if (Status s = CheckRequest(request); !s.ok()) return AnswerError(call, s);
  if (stopping_) {
    AnswerError(call, Error(Code::kUnavailable, "the daemon is stopping; retry after it restarts"));
    return;
  }
  switch (request.body_case()) {
    case v1::Envelope::kLoad: HandleLoad(call, request.load()); break;
    case v1::Envelope::kUnload: HandleUnload(call, request.unload()); break;
    case v1::Envelope::kInfer: HandleInfer(call, std::move(*request.mutable_infer())); break;
    case v1::Envelope::kModels: Answer(call, ModelsSnapshot()); break;
    case v1::Envelope::kPs: Answer(call, PsSnapshot()); break;
    case v1::Envelope::kStatus: Answer(call, StatusSnapshot()); break;
    case v1::Envelope::kFaultArm: HandleFaultArm(call, request.fault_arm()); break;
    case v1::Envelope::kFaultClear: HandleFaultClear(call); break;
    case v1::Envelope::kPin: HandlePin(call, request.pin()); break;
    case v1::Envelope::kRegisterModel:
      HandleRegister(call, request.register_model(), std::move(event.registration));
      break;
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

uint32_t Core::FindServing(const std::string& name) const {
  uint32_t model = index_->Find(name);
  if (model == shm::kNil || (runtime_[model].retiring && !runtime_[model].next)) return shm::kNil;
  return model;
}

void Core::HandlePin(const Call& call, const v1::PinRequest& request) {
  uint32_t model = FindServing(request.model());
  if (model == shm::kNil) return AnswerError(call, UnknownModel(request.model()));
  index_->Update(model, [&](shm::ModelRecord& r) { r.pinned = request.pin() ? 1 : 0; });
  if (!request.pin()) RetryPending();  // room may have been waiting for this one
  v1::Envelope reply;
  reply.mutable_pin_reply()->set_model(request.model());
  reply.mutable_pin_reply()->set_pinned(request.pin());
  Answer(call, std::move(reply));
}

void Core::HandleLoad(const Call& call, const v1::LoadRequest& request) {
  const std::string& name = request.model();
  uint32_t model = FindServing(name);
  if (model == shm::kNil) return AnswerError(call, UnknownModel(name));
  if (request.has_keep_alive_ms()) runtime_[model].keep_alive_override_ms = request.keep_alive_ms();
  if (request.replicas() != 0) {
    runtime_[model].target_replicas =
        std::min(request.replicas(), static_cast<uint32_t>(workers_.size()));
  }
  if (index_->State(model) == ModelState::kReady) {
    GrowReplicas(model);
    index_->Touch(model);
    if (index_->Get(model).inflight == 0) StartKeepAlive(model);
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
  // An explicit load retries a failed model at once, cooldown or not.
  runtime_[model].failed_until_ms = 0;
  Enqueue(model, Waiter{call, false, {}, 0, 0});
}

void Core::HandleUnload(const Call& call, const v1::UnloadRequest& request) {
  if (request.all()) {
    // Every ready model, parked where the park budget allows; one reply when all are done.
    uint64_t id = next_bulk_++;
    BulkUnload bulk{call, 0, 0, 0};
    for (uint32_t model : index_->LruOrder()) {
      if (index_->State(model) != ModelState::kReady) continue;
      runtime_[model].bulk.push_back(id);
      bulk.remaining++;
      bulk.total++;
    }
    if (bulk.total == 0) {
      v1::Envelope reply;
      reply.mutable_unload_reply()->set_model("0 model(s), 0 parked");
      return Answer(call, std::move(reply));
    }
    bulk_unloads_.emplace(id, bulk);
    for (uint32_t model : index_->LruOrder()) {
      if (index_->State(model) == ModelState::kReady) Release(model, /*eviction=*/false);
    }
    return;
  }
  const std::string& name = request.model();
  uint32_t model = index_->Find(name);
  if (model == shm::kNil) return AnswerError(call, UnknownModel(name));
  switch (index_->State(model)) {
    case ModelState::kReady:
      runtime_[model].unload_waiters.push_back(call);
      if (request.park()) {
        if (!CanPark(model) || runtime_[model].replica_slots.empty()) {
          runtime_[model].unload_waiters.pop_back();
          return AnswerError(call, Error(Code::kFailedPrecondition,
                                         "model \"{}\" cannot be parked: {} (set [pool] park_budget, "
                                         "or unload without --park)",
                                         name,
                                         index_->ParkBudget() == 0 ? "parking is disabled"
                                         : runtime_[model].weights_fd < 0
                                             ? "it has no weights to park"
                                             : "the park budget is full"));
        }
        Release(model, /*eviction=*/false);
      } else {
        StartUnload(model, /*eviction=*/false);
      }
      return;
    case ModelState::kParked:
      if (request.park()) {
        v1::Envelope reply;
        reply.mutable_unload_reply()->set_model(name);
        return Answer(call, std::move(reply));
      }
      // Dropping the parked copy.
      CloseHandle(runtime_[model].park_fd);
      runtime_[model].park_fd = -1;
      index_->MarkNotResident(model, ModelState::kRegistered, "");
      {
        v1::Envelope reply;
        reply.mutable_unload_reply()->set_model(name);
        Answer(call, std::move(reply));
      }
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

void Core::HandleInfer(const Call& call, v1::InferRequest&& request) {
  // The input's shape was checked with the rest of the request (request_check.cc).
  uint32_t model = FindServing(request.model());
  if (model == shm::kNil) return AnswerError(call, UnknownModel(request.model()));
  if (request.has_keep_alive_ms()) runtime_[model].keep_alive_override_ms = request.keep_alive_ms();
  if (queued_ >= config_.max_queue) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "{} requests are already waiting (limit {}): retry later",
                                   queued_, config_.max_queue));
  }
  uint32_t deadline = request.deadline_ms() != 0 ? request.deadline_ms() : config_.default_deadline_ms;
  uint64_t deadline_ms = deadline == 0 ? 0 : MonoMs() + deadline;  // 0: none
  Enqueue(model, Waiter{call, true, std::move(request), deadline_ms, 0});
}

}  // namespace warmpool::supervisor
