// Client requests: who may ask what, the budgets a request is held against, and the replies.
// What a request sets in motion lives in admission.cc (loads, unloads) and dispatch.cc
// (inference).
#include <algorithm>
#include <utility>

#include "common/units.h"
#include "supervisor/core/core.h"
#include "supervisor/core/request_check.h"

namespace warmpool::supervisor {

using namespace residency;

void Core::Answer(const Call& call, v1::Envelope&& reply) {
  auto it = sessions_.find(call.session);
  if (it == sessions_.end()) return;  // gone (or the preload, session 0): nobody to tell
  Session& s = it->second;
  if (s.outstanding > 0) {
    s.outstanding--;
    unanswered_--;
  }
  s.held_bytes -= std::min(s.held_bytes, call.bytes);
  held_bytes_ -= std::min(held_bytes_, call.bytes);
  reply.set_request_id(call.request_id);
  actions_.push_back(action::Reply{call.session, std::move(reply)});
}

void Core::AnswerError(const Call& call, const Status& status) {
  Answer(call, ErrorReply(call.request_id, status));
}

void Core::OnRequest(event::ClientRequest&& event) {
  v1::Envelope& request = event.envelope;
  Call call{event.session, request.request_id(), 0, MonoMs()};
  Session& session = sessions_[event.session];
  session.outstanding++;
  unanswered_++;
  // A descriptor is taken by a region request, and closed on every other path.
  const Status checked = CheckRequest(request);
  int handle = std::exchange(event.handle, -1);
  if (!request.has_region() || stopping_ || !checked.ok()) {
    Close(handle);
    handle = -1;
  }
  if (IsAdminRequest(request) && !event.admin && event.tcp) {
    return AnswerError(call, Error(Code::kPermissionDenied,
                                   "over TCP only reads and infer are allowed: send "
                                   "\"Authorization: Bearer TOKEN\" with the token of [http] "
                                   "admin_token_file, or use the Unix socket"));
  }
  if (IsAdminRequest(request) && !event.admin) {
    return AnswerError(call, Error(Code::kPermissionDenied,
                                   "uid {} may infer and read status, not register, load, unload, "
                                   "pin or arm faults: run as root or the daemon's user{}",
                                   event.uid,
                                   config_.admin_group.empty()
                                       ? std::string(", or set [access] admin_group")
                                       : fmt::format(", or join group {}", config_.admin_group)));
  }
  if (!checked.ok()) return AnswerError(call, checked);
  if (stopping_) {
    if (handed_over_) {
      return AnswerError(call, Error(Code::kUnavailable,
                                     "this warmpoold handed its socket to a new one: reconnect and send "
                                     "the request again"));
    }
    return AnswerError(call, Error(Code::kUnavailable, "the daemon is stopping; retry after it restarts"));
  }
  switch (request.body_case()) {
    case v1::Envelope::kLoad: return HandleLoad(call, request.load());
    case v1::Envelope::kUnload: return HandleUnload(call, request.unload());
    case v1::Envelope::kInfer: return HandleInfer(call, std::move(*request.mutable_infer()));
    case v1::Envelope::kGenerate: return HandleGenerate(call, std::move(*request.mutable_generate()));
    case v1::Envelope::kEmbed: return HandleEmbed(call, std::move(*request.mutable_embed()));
    case v1::Envelope::kModels: return Answer(call, ModelsSnapshot());
    case v1::Envelope::kPs: return Answer(call, PsSnapshot());
    case v1::Envelope::kStatus: return Answer(call, StatusSnapshot());
    case v1::Envelope::kFaultArm: return HandleFaultArm(call, request.fault_arm());
    case v1::Envelope::kFaultClear: return HandleFaultClear(call);
    case v1::Envelope::kPin: return HandlePin(call, request.pin());
    case v1::Envelope::kRegisterModel:
      return HandleRegister(call, request.register_model(), std::move(event.registration));
    case v1::Envelope::kRegion:
      return HandleRegion(call, request.region(), handle, event.handle_check);
    default:
      return AnswerError(call, Error(Code::kInvalidArgument,
                                     "request {} carries no request this daemon understands (body {})",
                                     request.request_id(), static_cast<int>(request.body_case())));
  }
}

void Core::OnClientGone(uint64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  unanswered_ -= it->second.outstanding;
  held_bytes_ -= std::min(held_bytes_, it->second.held_bytes);
  CloseRegions(it->second);  // workers running its requests hold their own duplicates
  sessions_.erase(it);
  CancelGenerations(session);
  // Nobody waits for its requests any more: those still queued never run, those running are
  // answered into the void and not retried (their inputs are let go now).
  for (Model& m : models_) {
    size_t before = m.waiters.size();
    std::erase_if(m.waiters, [&](const Waiter& w) { return w.call.session == session; });
    queued_ -= static_cast<uint32_t>(before - m.waiters.size());
    std::erase_if(m.unload_waiters, [&](const Call& c) { return c.session == session; });
  }
  for (auto& [id, job] : jobs_) {
    if (job.kind != Job::Kind::kInfer || job.call.session != session) continue;
    job.answered = true;
    job.request.Clear();
    if (job.generate) job.generate->clear_prompt();  // still a generation: its steps may come
    if (job.embed) job.embed->clear_input();
  }
  for (auto& [id, bulk] : bulk_unloads_) {
    if (bulk.call.session == session) bulk.call.session = 0;  // finishes, answers nobody
  }
}

uint32_t Core::Resolve(const std::string& name) const {
  const uint32_t model = index_->Find(name);
  if (model != shm::kNil) return model;
  // Not a registered name: maybe a configured alias of one ([[models]] aliases).
  for (const ModelConfig& c : config_.models) {
    if (std::find(c.aliases.begin(), c.aliases.end(), name) != c.aliases.end()) return index_->Find(c.name);
  }
  return shm::kNil;
}

Result<uint32_t> Core::FindServing(const std::string& name) const {
  uint32_t model = Resolve(name);
  const Model* m = model == shm::kNil ? nullptr : &models_[model];
  if (m == nullptr || (m->retiring && !*m->retiring)) {
    for (const auto& [refused, why] : refused_) {
      if (refused == name) {
        return Error(Code::kResourceExhausted, "model \"{}\" is not registered: {}", name, why);
      }
    }
    return Error(Code::kNotFound, "model \"{}\" is not registered (see 'warmpool models')", name);
  }
  return model;
}

void Core::HandlePin(const Call& call, const v1::PinRequest& request) {
  Result<uint32_t> model = FindServing(request.model());
  if (!model.ok()) return AnswerError(call, model.status());
  models_[*model].pinned = request.pin();
  index_->Update(*model, [&](shm::ModelRecord& r) { r.pinned = request.pin() ? 1 : 0; });
  if (!request.pin()) RetryPending();  // room may have been waiting for this one
  v1::Envelope reply;
  reply.mutable_pin_reply()->set_model(request.model());
  reply.mutable_pin_reply()->set_pinned(request.pin());
  Answer(call, std::move(reply));
}

void Core::HandleLoad(const Call& call, const v1::LoadRequest& request) {
  Result<uint32_t> found = FindServing(request.model());
  if (!found.ok()) return AnswerError(call, found.status());
  uint32_t model = *found;
  Model& m = models_[model];
  if (request.has_keep_alive_ms()) m.keep_alive_override_ms = request.keep_alive_ms();
  if (request.replicas() != 0) {
    m.target_replicas = std::min(request.replicas(), config_.workers_per_device);  // one device's workers
  }
  if (const Ready* ready = m.machine.As<Ready>(); ready != nullptr && !ready->replicas.empty()) {
    // What this request did is told in its reply: replicas added (or capped, and why), models
    // evicted to make room for them.
    const uint32_t before = StayingReplicas(model);
    m.evicted_for.clear();
    const std::string short_by = AdjustReplicas(model);
    index_->Touch(model);
    m.asked = true;
    if (m.inflight == 0) StartKeepAlive(model);
    v1::Envelope reply = LoadReplyFor(model, request.replicas(), short_by);
    reply.mutable_load_reply()->set_already_loaded(true);
    reply.mutable_load_reply()->set_replicas_before(before);
    m.evicted_for.clear();
    return Answer(call, std::move(reply));
  }
  if (queued_ >= config_.max_queue) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "{} requests are already waiting: retry later", queued_));
  }
  // An explicit load retries a failed model at once, cooldown or not.
  if (Failed* f = m.machine.As<Failed>()) f->until_ms = 0;
  Waiter waiter{call, false, {}, 0, 0};
  waiter.replicas_asked = request.replicas();
  Enqueue(model, std::move(waiter));
}

void Core::HandleUnloadAll(const Call& call) {
  // Every ready model, parked where the park budget allows; one reply when all are done.
  uint64_t id = next_bulk_++;
  BulkUnload bulk{call, 0, 0, 0};
  std::vector<uint32_t> ready;
  for (uint32_t model : index_->LruOrder()) {
    if (!models_[model].machine.Is<Ready>()) continue;
    models_[model].bulk.push_back(id);
    ready.push_back(model);
  }
  bulk.remaining = bulk.total = static_cast<uint32_t>(ready.size());
  if (ready.empty()) {
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model("0 model(s), 0 parked");
    return Answer(call, std::move(reply));
  }
  bulk_unloads_.emplace(id, bulk);
  for (uint32_t model : ready) Release(model, shm::ReleaseReason::kExplicit, /*allow_park=*/true, "unload --all");
}

void Core::HandleUnload(const Call& call, const v1::UnloadRequest& request) {
  if (request.all()) return HandleUnloadAll(call);
  const std::string& name = request.model();
  uint32_t model = index_->Find(name);
  if (model == shm::kNil) {
    return AnswerError(call, Error(Code::kNotFound, "model \"{}\" is not registered (see 'warmpool "
                                                    "models')", name));
  }
  Model& m = models_[model];
  auto done = [&] {
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model(name);
    Answer(call, std::move(reply));
  };
  if (const Ready* ready = m.machine.As<Ready>()) {
    if (request.park()) {
      bool attached = m.machine.Serving();
      uint64_t weights = ready->weights.weight_bytes;
      if (!policy::ShouldPark(weights, ready->weights.handle >= 0 && attached, ParkCommitted(),
                              Limits())) {
        return AnswerError(call, Error(Code::kFailedPrecondition,
                                       "model \"{}\" cannot be parked: {} (set [pool] park_budget, "
                                       "or unload without --park)",
                                       name,
                                       index_->ParkBudget() == 0      ? "parking is disabled"
                                       : ready->weights.handle < 0    ? "it has no weights to park"
                                       : !attached ? "no worker serves it to copy its weights"
                                                   : "the park budget is full"));
      }
    }
    m.unload_waiters.push_back(call);
    return Release(model, shm::ReleaseReason::kExplicit, /*allow_park=*/request.park(), "unload");
  }
  if (m.machine.Is<Parked>()) {
    if (!request.park()) DropParked(model, shm::ReleaseReason::kExplicit, "unload");
    return done();
  }
  if (m.machine.Is<Releasing>()) {
    m.unload_waiters.push_back(call);
    return;
  }
  if (m.machine.Is<Loading>() || m.machine.Is<Unparking>()) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" is loading; unload it once it is ready", name));
  }
  AnswerError(call, Error(Code::kFailedPrecondition, "model \"{}\" is not loaded (see 'warmpool ps')",
                          name));
}

void Core::HandleInfer(Call call, v1::InferRequest&& request) {
  // The input's shape was checked with the rest of the request (request_check.cc).
  Result<uint32_t> found = FindServing(request.model());
  if (!found.ok()) return AnswerError(call, found.status());
  uint32_t model = *found;
  Model& m = models_[model];
  if (m.entry.generates() && request.inputs_size() == 0) {
    return AnswerError(call, Error(Code::kFailedPrecondition,
                                   "model \"{}\" is a language model: send it a generate request, or typed "
                                   "tensors (inputs), not a matrix",
                                   m.entry.name));
  }
  if (request.has_keep_alive_ms()) m.keep_alive_override_ms = request.keep_alive_ms();
  if (queued_ >= config_.max_queue) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "{} requests are already waiting (limit {}): retry later",
                                   queued_, config_.max_queue));
  }
  // What the daemon holds of requests is bounded, per connection and in all: a client that
  // pipelines large inputs is told to wait for its replies instead of growing the daemon.
  // It travels to its worker in one frame. One that came over HTTP was parsed from JSON, whose
  // numbers may be shorter than their binary form ("0," is an 8-byte i64): it may not fit.
  if (request.ByteSizeLong() > config_.max_frame_bytes) {
    return AnswerError(call, Error(Code::kInvalidArgument,
                                   "the request takes {} bytes as sent to a worker, more than a frame's {} "
                                   "([limits] max_frame_bytes): send less per request",
                                   request.ByteSizeLong(), config_.max_frame_bytes));
  }
  uint64_t bytes = records::RequestDataBytes(request);
  if (Status s = CheckRegions(call.session, request); !s.ok()) return AnswerError(call, s);
  Session& session = sessions_[call.session];
  if (session.held_bytes + bytes > config_.max_queued_bytes_per_connection) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "this connection already has {} of requests in the daemon "
                                   "(limit {}): wait for replies before sending more, or raise "
                                   "[limits] max_queued_bytes_per_connection",
                                   FormatBytes(session.held_bytes),
                                   FormatBytes(config_.max_queued_bytes_per_connection)));
  }
  if (held_bytes_ + bytes > config_.max_queued_bytes) {
    return AnswerError(call, Error(Code::kResourceExhausted,
                                   "the daemon holds {} of requests (limit {}): retry later, or "
                                   "raise [limits] max_queued_bytes",
                                   FormatBytes(held_bytes_), FormatBytes(config_.max_queued_bytes)));
  }
  call.bytes = bytes;
  session.held_bytes += bytes;
  held_bytes_ += bytes;
  // Typed tensors are judged by their steps (core/dispatch.cc): no default deadline, as embeddings.
  const uint32_t default_deadline = request.inputs_size() > 0 ? 0 : config_.default_deadline_ms;
  uint32_t deadline = request.deadline_ms() != 0 ? request.deadline_ms() : default_deadline;
  uint64_t deadline_ms = deadline == 0 ? 0 : MonoMs() + deadline;  // 0: none
  Enqueue(model, Waiter{call, true, std::move(request), deadline_ms, 0});
}

void Core::AnswerUnloads(uint32_t model) {
  Model& m = models_[model];
  std::vector<Call> waiters;
  waiters.swap(m.unload_waiters);
  for (const Call& call : waiters) {
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model(index_->Get(model).name);
    Answer(call, std::move(reply));
  }
  std::vector<uint64_t> ids;
  ids.swap(m.bulk);
  bool parked = m.machine.Is<Parked>();
  for (uint64_t id : ids) {
    auto it = bulk_unloads_.find(id);
    if (it == bulk_unloads_.end()) continue;
    it->second.parked += parked ? 1 : 0;
    if (--it->second.remaining > 0) continue;
    v1::Envelope reply;
    reply.mutable_unload_reply()->set_model(
        fmt::format("{} model(s), {} parked", it->second.total, it->second.parked));
    Answer(it->second.call, std::move(reply));
    bulk_unloads_.erase(it);
  }
}

}  // namespace warmpool::supervisor
