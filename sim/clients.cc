// Simulated clients: they pipeline requests of every kind, sometimes large ones, leave without
// reading their replies and come back as new sessions. Every reply is checked on arrival: it
// answers a request that is outstanding (exactly once), and a successful inference was computed
// from one consistent version of the model that was asked for. Some register shared-memory
// regions, name tensors in them (theirs, gone ones, slices past the end) and remove them.
#include <cstring>

#include <fmt/format.h>

#include "sim/simulator.h"

namespace warmpool::sim {

namespace event = supervisor::event;

std::string Simulator::PickModel() {
  uint64_t roll = rng_.Below(100);
  if (models_in_use_ <= 2) return files_[rng_.Below(models_in_use_)].name;
  if (roll < 2) return "nope";                        // not registered
  if (roll < 8) return files_[6 + rng_.Below(2)].name;  // registered by a client, or not
  if (roll < 14 && models_in_use_ > 2) return "echo";
  return files_[rng_.Below(models_in_use_)].name;
}

void Simulator::ClientAct(uint32_t index) {
  if (failed_ || workers_stopped_) return;
  Client& c = clients_[index];
  After(rng_.Range(1, 40), [this, index] { ClientAct(index); }, /*outlives=*/true);
  if (!c.connected) {
    if (stopping_) return;  // no new connections once the daemon stops accepting
    c.connected = true;
    c.session = next_session_++;
    c.outstanding.clear();
    c.regions.clear();
    c.last_delivery_ms = now_;
    return;
  }
  if (rng_.Chance(15)) {
    // Gone, replies unread. The daemon learns of it a moment later.
    uint64_t session = c.session;
    c.connected = false;
    c.outstanding.clear();
    c.regions.clear();
    After(rng_.Range(0, 3), Reading([this, session] {
      gone_sessions_.insert(session);
      Deliver(event::ClientGone{session}, fmt::format("session {} gone", session));
    }));
    return;
  }
  if (c.outstanding.size() >= (c.greedy ? 30u : 8u)) return;
  v1::Envelope request;
  Pending p;
  if (!c.greedy && rng_.Chance(30)) {
    // Shared memory: a region registered (its memfd with the frame), or one let go; sometimes one
    // that is not this connection's, or already gone.
    p.kind = Pending::Kind::kRegion;
    if (c.regions.empty() || rng_.Chance(600)) {
      request.mutable_region()->set_bytes(kRegionBytes);
      Region memory;
      memory.host = true;
      memory.client = true;
      memory.bytes = kRegionBytes;
      p.handle = NewSupervisorHandle(memory);
    } else {
      size_t k = rng_.Below(c.regions.size());
      request.mutable_region()->set_remove(rng_.Chance(50) ? next_token_ : c.regions[k]);
      c.regions.erase(c.regions.begin() + static_cast<ptrdiff_t>(k));
    }
    return SendRequest(c, std::move(request), p);
  }
  if (!c.greedy && !c.regions.empty() && rng_.Chance(200)) {
    // An inference on tensors in a region (the input there; the output too, when it fits).
    p.kind = Pending::Kind::kInfer;
    p.in_region = true;
    p.model = PickModel();
    v1::InferRequest* infer = request.mutable_infer();
    infer->set_model(p.model);
    const uint32_t rows = static_cast<uint32_t>(rng_.Range(1, 100));
    const uint64_t region = c.regions[rng_.Below(c.regions.size())];
    infer->mutable_input()->set_rows(rows);
    infer->mutable_input()->set_cols(6);
    infer->mutable_input_region()->set_region(region);
    infer->mutable_input_region()->set_offset(rng_.Chance(20) ? kRegionBytes - 4 : 0);  // past its end
    infer->mutable_input_region()->set_bytes(uint64_t{rows} * 24);
    if (rng_.Chance(500)) {
      infer->mutable_output_region()->set_region(region);
      infer->mutable_output_region()->set_offset(kRegionBytes / 2);
      infer->mutable_output_region()->set_bytes(rng_.Range(4, kRegionBytes / 2));
    }
    p.deadline_ms = config_.default_deadline_ms;
    return SendRequest(c, std::move(request), p);
  }
  if (!c.greedy && rng_.Chance(150)) return ClientGenerates(c);
  uint64_t roll = c.greedy ? 0 : rng_.Below(1000);
  if (calm_ && roll >= 700 && roll < 890) roll = 900;  // a read instead of a load, unload or pin
  if (roll < 700) {
    p.kind = Pending::Kind::kInfer;
    p.model = PickModel();
    v1::InferRequest* infer = request.mutable_infer();
    infer->set_model(p.model);
    uint32_t rows = rng_.Chance(c.greedy ? 900 : 30) ? static_cast<uint32_t>(rng_.Range(500, 4000)) : 1;
    std::vector<float> values(uint64_t{rows} * 6, 0.5f);
    p.token = next_token_++;
    values[0] = static_cast<float>(p.token);
    values[1] = static_cast<float>(c.session);
    infer->mutable_input()->set_rows(rows);
    infer->mutable_input()->set_cols(6);
    infer->mutable_input()->set_data(reinterpret_cast<const char*>(values.data()),
                                     values.size() * sizeof(float));
    p.bytes = values.size() * sizeof(float);
    if (!c.greedy && rng_.Chance(20)) {  // the same rows as a typed tensor: never batched
      v1::NamedTensor* x = infer->add_inputs();
      x->set_name("x");
      x->set_dtype(v1::DTYPE_F32);
      x->add_shape(rows);
      x->add_shape(6);
      x->set_allocated_data(infer->mutable_input()->release_data());
      infer->clear_input();
      p.typed = true;
      // Typed tensors have no default deadline (judged by their steps, as embeddings): this
      // client's own bounds the wait the deadline check below allows.
      infer->set_deadline_ms(static_cast<uint32_t>(rng_.Range(50, 3000)));
    }
    if (!p.typed && rng_.Chance(700)) infer->set_deadline_ms(static_cast<uint32_t>(rng_.Range(50, 3000)));
    p.deadline_ms = infer->deadline_ms() != 0 ? infer->deadline_ms() : config_.default_deadline_ms;
    if (rng_.Chance(50)) infer->set_keep_alive_ms(static_cast<int64_t>(rng_.Range(0, 500)));
    token_session_[p.token] = c.session;
  } else if (roll < 780) {
    p.kind = Pending::Kind::kLoad;
    p.model = PickModel();
    request.mutable_load()->set_model(p.model);
    if (rng_.Chance(300)) request.mutable_load()->set_replicas(static_cast<uint32_t>(rng_.Range(1, 3)));
    if (rng_.Chance(100)) request.mutable_load()->set_keep_alive_ms(static_cast<int64_t>(rng_.Range(0, 1000)));
  } else if (roll < 860) {
    p.model = PickModel();
    request.mutable_unload()->set_model(p.model);
    request.mutable_unload()->set_park(rng_.Chance(500));
    if (rng_.Chance(80)) request.mutable_unload()->set_all(true);
  } else if (roll < 890) {
    p.model = PickModel();
    request.mutable_pin()->set_model(p.model);
    request.mutable_pin()->set_pin(rng_.Chance(400));
  } else if (roll < 940) {
    switch (rng_.Below(3)) {
      case 0: request.mutable_ps(); break;
      case 1: request.mutable_status(); break;
      default: request.mutable_models(); break;
    }
  } else {
    // `warmpool register` of a client's model (or its removal). The shell looks at the file.
    const SimFile& f = files_[6 + rng_.Below(2)];
    p.model = f.name;
    v1::RegisterRequest* r = request.mutable_register_model();
    r->set_model(f.name);
    if (rng_.Chance(300)) {
      r->set_remove(true);
    } else {
      r->set_path(f.path);
    }
  }
  SendRequest(c, std::move(request), p);
}

void Simulator::SendRequest(Client& c, v1::Envelope request, Pending pending) {
  uint64_t id = c.next_request++;
  request.set_request_id(id);
  pending.sent_ms = now_;
  outcome_.requests++;
  c.outstanding[id] = pending;
  uint64_t at = std::max(now_ + rng_.Range(0, 1), c.last_delivery_ms);
  c.last_delivery_ms = at;
  uint64_t session = c.session;
  uint32_t index = c.index;
  At(at, Reading([this, index, session, id, request = std::move(request)]() mutable {
    Client& c = clients_[index];
    if (!c.connected || c.session != session) return;  // it left before the bytes went out
    auto it = c.outstanding.find(id);
    if (it == c.outstanding.end()) return;
    it->second.accepted = true;
    for (const SimFile& f : files_) {
      if (f.name == it->second.model) it->second.min_version = registered_version_[f.id];
    }
    event::ClientRequest e;
    e.session = session;
    e.handle = it->second.handle;  // the supervisor's descriptor once the frame is read
    if (e.handle >= 0) supervisor_handles_.insert(e.handle);
    e.admin = c.admin;
    e.uid = c.admin ? 0 : 1000;
    if (request.has_register_model() && !request.register_model().remove() && c.admin) {
      for (const SimFile& f : files_) {
        if (f.path != request.register_model().path()) continue;
        supervisor::ModelEntry entry = EntryOf(f);
        if (entry.problem.ok()) e.registration = entry;
        else e.registration = entry.problem;
      }
    }
    std::string what = fmt::format("session {} request {}: {}", session, id,
                                   Brief(request));
    e.envelope = request;  // copied: a delivery held over a pause runs from a copy of this closure
    Deliver(std::move(e), what);
  }));
}

void Simulator::ClientReceives(uint64_t session, const v1::Envelope& reply) {
  for (Client& c : clients_) {
    if (c.session != session || !c.connected) continue;
    auto it = c.outstanding.find(reply.request_id());
    if (it == c.outstanding.end()) {
      return Fail(fmt::format("session {} got a reply to request {}, which is not outstanding "
                              "(answered twice, or never asked)",
                              session, reply.request_id()));
    }
    if (reply.has_generate_chunk()) return CheckGenerateReply(it->second, reply, /*final=*/false);
    Pending p = it->second;
    c.outstanding.erase(it);
    if (p.kind == Pending::Kind::kInfer) CheckInferReply(p, reply);
    if (p.kind == Pending::Kind::kGenerate) CheckGenerateReply(p, reply, /*final=*/true);
    if (p.kind == Pending::Kind::kEmbed) CheckEmbedReply(p, reply);
    if (p.kind == Pending::Kind::kRegion && reply.has_region_reply() && !reply.region_reply().removed()) {
      c.regions.push_back(reply.region_reply().region());
    }
    return;
  }
}

void Simulator::CheckInferReply(const Pending& p, const v1::Envelope& reply) {
  if (reply.has_error()) {
    if (reply.error().message().find("is not loaded in worker") != std::string::npos) {
      Fail(fmt::format("request for \"{}\" went to a worker that does not serve it: {}", p.model,
                       reply.error().message()));
    }
    return;
  }
  if (!reply.has_infer_reply()) return Fail(fmt::format("infer on \"{}\" got a reply of another kind", p.model));
  v1::Tensor typed;  // a typed reply's one output, seen as the matrix the engines computed
  if (p.typed) {
    const v1::InferReply& r = reply.infer_reply();
    if (r.has_output() || r.outputs_size() != 1 || r.outputs(0).shape_size() != 2 || r.outputs(0).name() != "x") {
      return Fail(fmt::format("typed tensors for \"{}\" got {} outputs and {} a matrix", p.model, r.outputs_size(),
                              r.has_output() ? "" : "no"));
    }
    typed.set_rows(static_cast<uint32_t>(r.outputs(0).shape(0)));
    typed.set_cols(static_cast<uint32_t>(r.outputs(0).shape(1)));
    typed.set_data(r.outputs(0).data());
  }
  const v1::Tensor& out = p.typed ? typed : reply.infer_reply().output();
  if (p.in_region && p.model == "echo") return;  // the bytes are the region's, not simulated
  if (p.model == "echo") {
    float token = 0;
    if (out.data().size() >= sizeof(float)) std::memcpy(&token, out.data().data(), sizeof(float));
    if (static_cast<uint32_t>(token) != p.token) {
      Fail(fmt::format("echo answered token {} for request token {}", token, p.token));
    }
    return;
  }
  if (out.cols() != 6 || out.data().size() < 6 * sizeof(float)) {
    return Fail(fmt::format("infer on \"{}\" returned {} x {}", p.model, out.rows(), out.cols()));
  }
  float v[6];
  std::memcpy(v, out.data().data(), sizeof(v));
  uint32_t file = 0;
  for (const SimFile& f : files_) {
    if (f.name == p.model) file = f.id;
  }
  auto token = static_cast<uint32_t>(v[0]);
  auto weights_file = static_cast<uint32_t>(v[1]), weights_version = static_cast<uint32_t>(v[2]);
  auto described_file = static_cast<uint32_t>(v[3]), described_version = static_cast<uint32_t>(v[4]);
  if (token != p.token && !p.in_region) {
    return Fail(fmt::format("request with token {} for \"{}\" got the answer to token {}", p.token,
                            p.model, token));
  }
  if (weights_file != file || described_file != file) {
    return Fail(fmt::format("\"{}\" (file {}) answered from the weights of file {} described as "
                            "file {}",
                            p.model, file, weights_file, described_file));
  }
  if (weights_version != described_version) {
    return Fail(fmt::format("\"{}\" answered from weights of version {} described as version {}: "
                            "the result matches neither",
                            p.model, weights_version, described_version));
  }
  if (weights_version < p.min_version) {
    return Fail(fmt::format("\"{}\" answered from version {}, though a reload had registered "
                            "version {} before the request came",
                            p.model, weights_version, p.min_version));
  }
  outcome_.replies_ok++;
}

}  // namespace warmpool::sim
