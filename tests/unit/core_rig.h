// A core driven by hand: scripted events in, the actions it returns kept for the test to read, and
// after every event the segment's and the core's invariants checked. No process, no socket, no
// clock: the cheapest level at which a race of the supervisor can be written down exactly.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/framing.h"
#include "shm/model_index.h"
#include "shm/segment.h"
#include "supervisor/core/core.h"

namespace warmpool::supervisor::testing {

// A model file as the registry would describe it: `version` goes into the header bytes, so that
// two versions of one file have different headers.
inline ModelEntry Entry(const std::string& name, uint64_t weight_bytes, uint64_t workspace_bytes,
                        int version = 1) {
  ModelEntry e;
  e.name = name;
  e.engine = "dense";
  e.path = "/models/" + name + ".safetensors";
  e.weight_bytes = weight_bytes;
  e.workspace_bytes = workspace_bytes;
  e.in_features = 4;
  e.out_features = 4;
  e.header = name + " header v" + std::to_string(version);
  e.file_size = e.header.size() + weight_bytes;
  e.version = FileVersion{e.file_size, 1000u + static_cast<uint64_t>(version), 42, 1, 2000u + static_cast<uint64_t>(version)};
  return e;
}

// A language model's entry: a directory served by the transformer engine, with a context.
inline ModelEntry LanguageModel(const std::string& name) {
  ModelEntry e = Entry(name, 100, 10);
  e.engine = "transformer";
  e.path = "/models/" + name;
  e.in_features = 0;
  e.out_features = 0;
  e.context = 64;
  e.kv_bytes_per_token = 8;
  e.embedding_size = 4;
  return e;
}

class CoreRig {
 public:
  explicit CoreRig(Config config) : config_(std::move(config)) {
    std::vector<uint64_t> budgets;
    for (const DeviceConfig& d : config_.devices) budgets.push_back(d.budget_bytes);
    if (budgets.empty()) budgets.push_back(config_.budget_bytes);
    shm::Limits limits{config_.max_models,
                       config_.workers_per_device * static_cast<uint32_t>(budgets.size()),
                       config_.max_inflight};
    bytes_.assign(shm::SegmentSize(limits), std::byte{0});
    view_ = *shm::SegmentView::Format(bytes_, limits, budgets, 1);
    core_ = std::make_unique<Core>(config_, view_);
  }

  static Config SmallConfig() {
    Config c;
    c.workers_per_device = 2;
    c.max_models = 8;
    c.max_inflight = 32;
    c.budget_bytes = 1000;
    c.default_deadline_ms = 1000;
    c.max_queued_bytes = 1 << 20;
    c.max_queued_bytes_per_connection = 1 << 20;
    c.max_frame_bytes = 1 << 20;
    return c;
  }

  void Start(std::vector<ModelEntry> entries, std::vector<KeptWeights> kept = {}) {
    Take(core_->Start(std::move(entries), {}, Now(), std::move(kept)));
  }
  void Handle(Event event) { Take(core_->Handle(std::move(event), Now())); }
  void Advance(uint64_t ms) {
    for (uint64_t t = 0; t < ms; t += kTickMs) {
      now_ms_ += kTickMs;
      Handle(event::Tick{});
    }
  }

  // The worker of a slot is spawned (when the core asked) and says hello.
  void Up(uint32_t slot) {
    uint32_t generation = 0;
    for (const Action& a : actions_) {
      if (auto* s = std::get_if<action::SpawnWorker>(&a); s != nullptr && s->slot == slot) {
        generation = s->generation;
      }
    }
    ASSERT_NE(generation, 0u) << "the core never asked for worker " << slot;
    Handle(event::WorkerSpawned{slot, generation, static_cast<int>(1000 + slot)});
    Handle(event::WorkerUp{slot, generation});
    generation_[slot] = generation;
  }
  // The worker dies: SIGKILLed, or (fatal) exiting with status 2, never to be started again.
  void Down(uint32_t slot, std::vector<uint64_t> running = {}, bool fatal = false) {
    event::WorkerDown d;
    d.slot = slot;
    d.generation = generation_[slot];
    d.why = fatal ? "exited with status 2" : "killed by signal 9 (Killed)";
    d.exit_text = d.why;
    d.exit_code = fatal ? 2 : 137;
    d.fatal = fatal;
    d.running_jobs = std::move(running);
    Handle(std::move(d));
  }
  // handle: a descriptor that came with the frame (a region's memfd), checked as `check`.
  uint64_t Request(uint64_t session, v1::Envelope envelope, bool admin = true, int handle = -1,
                   Status check = OkStatus()) {
    uint64_t id = next_request_++;
    envelope.set_request_id(id);
    event::ClientRequest r;
    r.session = session;
    r.admin = admin;
    r.handle = handle;
    r.handle_check = std::move(check);
    r.envelope = std::move(envelope);
    Handle(std::move(r));
    return id;
  }
  uint64_t Infer(uint64_t session, const std::string& model, uint32_t rows = 1, uint32_t cols = 4) {
    v1::Envelope e;
    e.mutable_infer()->set_model(model);
    e.mutable_infer()->mutable_input()->set_rows(rows);
    e.mutable_infer()->mutable_input()->set_cols(cols);
    e.mutable_infer()->mutable_input()->set_data(std::string(uint64_t{rows} * cols * 4, '\0'));
    return Request(session, std::move(e));
  }
  uint64_t Load(uint64_t session, const std::string& model, uint32_t replicas = 0) {
    v1::Envelope e;
    e.mutable_load()->set_model(model);
    e.mutable_load()->set_replicas(replicas);
    return Request(session, std::move(e));
  }
  uint64_t Unload(uint64_t session, const std::string& model, bool park = false) {
    v1::Envelope e;
    e.mutable_unload()->set_model(model);
    e.mutable_unload()->set_park(park);
    return Request(session, std::move(e));
  }
  void Reply(uint32_t slot, v1::WorkerEnvelope message, std::vector<int> handles = {}) {
    Handle(event::WorkerMessage{slot, std::move(message), std::move(handles)});
  }
  // An admin asks for the model and the worker of `slot`, which the core picks, loads it (its
  // weights region: `handle`).
  void Loaded(uint32_t slot, const ModelEntry& entry, int handle, uint32_t replicas = 0) {
    Load(1, entry.name, replicas);
    std::vector<v1::WorkerEnvelope> sent = Sent(slot);
    ASSERT_EQ(sent.size(), 1u) << "the load goes to worker " << slot;
    ASSERT_TRUE(sent[0].has_load());
    Reply(slot, LoadDone(sent[0].load().job(), entry), {handle});
  }
  // A load or attach done, as the worker would say it.
  static v1::WorkerEnvelope LoadDone(uint64_t job, const ModelEntry& as_read, bool shared = true) {
    v1::WorkerEnvelope m;
    v1::WorkerLoadDone* d = m.mutable_load_done();
    d->set_job(job);
    ToWire(as_read, d->mutable_weights());
    // As a worker that says nothing of the file's version: the core takes the registration's.
    d->mutable_weights()->clear_file_version();
    d->mutable_weights()->set_in_features(4);
    d->mutable_weights()->set_out_features(4);
    d->set_weights_shared(shared);
    return m;
  }
  // A park done: the host copy of `bytes` is the region that goes with it.
  static v1::WorkerEnvelope ParkDone(uint64_t job, uint64_t bytes) {
    v1::WorkerEnvelope m;
    m.mutable_park_done()->set_job(job);
    m.mutable_park_done()->set_bytes(bytes);
    m.mutable_park_done()->set_copy_shared(true);
    return m;
  }
  static v1::WorkerEnvelope UnloadDone(uint64_t job) {
    v1::WorkerEnvelope m;
    m.mutable_unload_done()->set_job(job);
    return m;
  }
  static v1::WorkerEnvelope InferDone(uint64_t job) {
    v1::WorkerEnvelope m;
    m.mutable_infer_done()->set_job(job);
    m.mutable_infer_done()->mutable_output()->set_rows(1);
    m.mutable_infer_done()->mutable_output()->set_cols(4);
    m.mutable_infer_done()->mutable_output()->set_data(std::string(16, '\0'));
    return m;
  }

  // Frames the core sent to a worker since the last call, parsed.
  std::vector<v1::WorkerEnvelope> Sent(uint32_t slot) {
    std::vector<v1::WorkerEnvelope> out;
    for (auto& [m, handles] : SentWithHandles(slot)) out.push_back(std::move(m));
    return out;
  }
  // ... with the handles that went with each.
  std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> SentWithHandles(uint32_t slot) {
    std::vector<std::pair<v1::WorkerEnvelope, std::vector<int>>> out;
    std::vector<Action> rest;
    for (Action& a : actions_) {
      auto* s = std::get_if<action::SendToWorker>(&a);
      if (s == nullptr || s->slot != slot) {
        rest.push_back(std::move(a));
        continue;
      }
      v1::WorkerEnvelope m;
      EXPECT_TRUE(m.ParseFromArray(s->frame.data() + ipc::kFramePrefixBytes,
                                   static_cast<int>(s->frame.size() - ipc::kFramePrefixBytes)));
      out.emplace_back(std::move(m), s->handles);
    }
    actions_ = std::move(rest);
    return out;
  }
  // The frames for a worker since the last call, as the core asked for them.
  std::vector<action::SendToWorker> SendsTo(uint32_t slot) {
    std::vector<action::SendToWorker> out;
    std::vector<Action> rest;
    for (Action& a : actions_) {
      auto* s = std::get_if<action::SendToWorker>(&a);
      if (s != nullptr && s->slot == slot) out.push_back(std::move(*s));
      else rest.push_back(std::move(a));
    }
    actions_ = std::move(rest);
    return out;
  }
  // Replies to a session since the last call.
  std::vector<v1::Envelope> Replies(uint64_t session) {
    std::vector<v1::Envelope> out;
    std::vector<Action> rest;
    for (Action& a : actions_) {
      auto* r = std::get_if<action::Reply>(&a);
      if (r != nullptr && r->session == session) out.push_back(std::move(r->envelope));
      else rest.push_back(std::move(a));
    }
    actions_ = std::move(rest);
    return out;
  }
  std::vector<int> Closed() {
    std::vector<int> out;
    for (const Action& a : actions_) {
      if (auto* c = std::get_if<action::CloseHandle>(&a)) out.push_back(c->handle);
    }
    return out;
  }
  // Log lines since the last Forget, joined.
  std::string Logs() const {
    std::string out;
    for (const Action& a : actions_) {
      if (auto* l = std::get_if<action::Log>(&a)) out += l->text + "\n";
    }
    return out;
  }
  // The actions of type A since the last Forget, in order.
  template <typename A>
  std::vector<A> Of() const {
    std::vector<A> out;
    for (const Action& a : actions_) {
      if (auto* x = std::get_if<A>(&a)) out.push_back(*x);
    }
    return out;
  }
  template <typename A>
  size_t Count() const {
    size_t n = 0;
    for (const Action& a : actions_) n += std::holds_alternative<A>(a);
    return n;
  }
  void Forget() { actions_.clear(); }

  Core& core() { return *core_; }
  const shm::ModelIndex& index() const { return core_->index(); }
  const shm::SegmentView& view() const { return view_; }
  uint64_t Used(uint32_t device = 0) const { return core_->index().DeviceUsed(device); }
  // The device a model's record says it is on.
  uint32_t DeviceOf(const std::string& name) const { return index().Get(index().Find(name)).device; }
  shm::ModelState State(const std::string& name) const {
    return index().State(index().Find(name));
  }

 private:
  Time Now() const { return Time{now_ms_, 1'700'000'000'000'000'000ull + now_ms_ * 1000000}; }
  void Take(std::vector<Action> actions) {
    for (Action& a : actions) {
      if (const auto* send = std::get_if<action::SendToWorker>(&a)) {
        Status allocation = action::CheckAllocation(*send);
        EXPECT_TRUE(allocation.ok()) << allocation.ToString();
      }
      actions_.push_back(std::move(a));
    }
    Status valid = shm::Validate(view_);
    EXPECT_TRUE(valid.ok()) << "segment: " << valid.ToString();
    Status core = core_->CheckInvariants();
    EXPECT_TRUE(core.ok()) << "core: " << core.ToString();
  }

  Config config_;
  std::vector<std::byte> bytes_;
  shm::SegmentView view_;
  std::unique_ptr<Core> core_;
  std::vector<Action> actions_;
  uint64_t now_ms_ = 1000;
  uint64_t next_request_ = 1;
  uint32_t generation_[16] = {};
};

}  // namespace warmpool::supervisor::testing
