// What the core tells users is what it did: one set of sizes for a model in every view, what a
// load did (replicas added or capped, models evicted), every release logged with its reason,
// refusals that name the limit in the way, keep_alive 0 meaning "release when idle", a broken
// file called broken, adopted models that still expire.
#include <algorithm>

#include "tests/unit/core_rig.h"
#include "tests/text.h"

namespace warmpool::supervisor::testing {
namespace {

using ::warmpool::testing::Contains;

v1::Envelope Ask(CoreRig& rig, uint64_t session, v1::Envelope request) {
  rig.Request(session, std::move(request));
  std::vector<v1::Envelope> replies = rig.Replies(session);
  EXPECT_EQ(replies.size(), 1u);
  return replies.empty() ? v1::Envelope() : replies[0];
}

v1::PsEntry PsOf(CoreRig& rig, const std::string& name) {
  v1::Envelope ps;
  ps.mutable_ps();
  const v1::Envelope reply = Ask(rig, 9, ps);
  for (const v1::PsEntry& e : reply.ps_reply().models()) {
    if (e.name() == name) return e;
  }
  ADD_FAILURE() << name << " is not in ps";
  return {};
}

v1::ModelInfo ModelOf(CoreRig& rig, const std::string& name) {
  v1::Envelope models;
  models.mutable_models();
  const v1::Envelope reply = Ask(rig, 9, models);
  for (const v1::ModelInfo& m : reply.models_reply().models()) {
    if (m.name() == name) return m;
  }
  ADD_FAILURE() << name << " is not in models";
  return {};
}

TEST(CoreTruthTest, OneModelHasOneSetOfSizesInLoadModelsAndPs) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry a = Entry("a", 300, 50);
  rig.Start({a});
  rig.Up(0);
  rig.Up(1);
  rig.Load(1, "a");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  const uint32_t slot = sent.empty() ? 1 : 0;
  if (sent.empty()) sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  rig.Reply(slot, CoreRig::LoadDone(sent[0].load().job(), a), {100});
  std::vector<v1::Envelope> loaded = rig.Replies(1);
  ASSERT_EQ(loaded.size(), 1u);
  const v1::LoadReply& load = loaded[0].load_reply();
  EXPECT_EQ(load.weight_bytes(), 300u);
  EXPECT_EQ(load.workspace_bytes(), 50u);
  EXPECT_EQ(load.replicas(), 1u);
  const v1::ModelInfo info = ModelOf(rig, "a");
  const v1::PsEntry ps = PsOf(rig, "a");
  EXPECT_EQ(info.weight_bytes(), 300u);
  EXPECT_EQ(info.workspace_bytes(), 50u);
  EXPECT_EQ(ps.weight_bytes(), 300u);
  EXPECT_EQ(ps.workspace_bytes(), 50u);
  EXPECT_EQ(ps.bytes(), 350u) << "ps's old field is the total, as before";
}

TEST(CoreTruthTest, KeepAliveZeroReleasesEvenTheMostRecentlyUsedModelWhenItsRequestsEnd) {
  Config config = CoreRig::SmallConfig();
  config.workers_per_device = 1;
  CoreRig rig(config);
  ModelEntry a = Entry("a", 300, 50);
  rig.Start({a});
  rig.Up(0);
  rig.Loaded(0, a, 100);
  rig.Forget();
  v1::Envelope infer;
  infer.mutable_infer()->set_model("a");
  infer.mutable_infer()->set_keep_alive_ms(0);
  infer.mutable_infer()->mutable_input()->set_rows(1);
  infer.mutable_infer()->mutable_input()->set_cols(4);
  infer.mutable_infer()->mutable_input()->set_data(std::string(16, '\0'));
  rig.Request(2, infer);
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  rig.Advance(200);  // still running: nothing is released under a request
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady);
  rig.Reply(0, CoreRig::InferDone(sent[0].infer().job()));
  rig.Forget();
  rig.Advance(kTickMs);
  EXPECT_EQ(rig.State("a"), shm::ModelState::kUnloading)
      << "the only model, and the most recently used, goes at once with keep_alive 0";
  EXPECT_TRUE(Contains(rig.Logs(), "releasing \"a\" (keep_alive: keep_alive 0")) << rig.Logs();
}

TEST(CoreTruthTest, APositiveKeepAliveStillSparesTheLastWarmModel) {
  Config config = CoreRig::SmallConfig();
  config.keep_alive_ms = 100;
  CoreRig rig(config);
  ModelEntry a = Entry("a", 300, 50);
  rig.Start({a});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  rig.Advance(1000);
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady) << "a quiet period keeps the only warm model";
}

TEST(CoreTruthTest, APinnedModelShowsNoExpiry) {
  Config config = CoreRig::SmallConfig();
  config.keep_alive_ms = 60000;
  CoreRig rig(config);
  ModelEntry a = Entry("a", 300, 50);
  rig.Start({a});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  EXPECT_TRUE(PsOf(rig, "a").has_expiry());
  v1::Envelope pin;
  pin.mutable_pin()->set_model("a");
  pin.mutable_pin()->set_pin(true);
  Ask(rig, 3, pin);
  const v1::PsEntry e = PsOf(rig, "a");
  EXPECT_TRUE(e.pinned());
  EXPECT_FALSE(e.has_expiry()) << "pinned models never expire: no countdown to show";
  EXPECT_TRUE(ModelOf(rig, "a").pinned());
}

TEST(CoreTruthTest, LoadWithMoreReplicasThanWorkersSaysWhatItDidAndWhy) {
  CoreRig rig(CoreRig::SmallConfig());  // 2 workers on the one device
  ModelEntry a = Entry("a", 300, 50);
  rig.Start({a});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  rig.Forget();
  v1::Envelope reply = Ask(rig, 4, [] {
    v1::Envelope e;
    e.mutable_load()->set_model("a");
    e.mutable_load()->set_replicas(5);
    return e;
  }());
  ASSERT_TRUE(reply.has_load_reply()) << reply.DebugString();
  const v1::LoadReply& r = reply.load_reply();
  EXPECT_TRUE(r.already_loaded());
  EXPECT_EQ(r.replicas_before(), 1u);
  EXPECT_EQ(r.replicas(), 2u) << "one replica added (attaching)";
  EXPECT_EQ(r.replicas_asked(), 5u);
  EXPECT_TRUE(Contains(r.replicas_capped(), "workers_per_device = 2")) << r.replicas_capped();
  EXPECT_EQ(r.workspace_bytes(), 100u) << "two replicas' workspaces";
}

TEST(CoreTruthTest, AReplicaThatEvictsAModelSaysSoInTheReplyAndTheLog) {
  CoreRig rig(CoreRig::SmallConfig());  // budget 1000
  ModelEntry a = Entry("a", 300, 200), b = Entry("b", 300, 100);
  rig.Start({a, b});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, b, 101);
  rig.Forget();
  rig.Load(1, "a");  // loads on worker 1 (worker 0 holds b)
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  rig.Reply(1, CoreRig::LoadDone(sent[0].load().job(), a), {100});
  rig.Replies(1);
  ASSERT_EQ(rig.Used(), 900u);
  rig.Forget();
  v1::Envelope reply = Ask(rig, 4, [] {
    v1::Envelope e;
    e.mutable_load()->set_model("a");
    e.mutable_load()->set_replicas(2);
    return e;
  }());
  ASSERT_TRUE(reply.has_load_reply()) << reply.DebugString();
  const v1::LoadReply& r = reply.load_reply();
  ASSERT_EQ(r.evicted_size(), 1);
  EXPECT_EQ(r.evicted(0), "b");
  EXPECT_TRUE(Contains(rig.Logs(), "releasing \"b\" (budget: evicted to make room for a replica of \"a\")"))
      << rig.Logs();
}

TEST(CoreTruthTest, ARefusalUnderSingleActiveNamesSingleActiveNotTheBudget) {
  Config config = CoreRig::SmallConfig();
  config.single_active = true;
  CoreRig rig(config);
  ModelEntry a = Entry("a", 300, 50), b = Entry("b", 300, 50);
  rig.Start({a, b});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, a, 100);
  v1::Envelope pin;
  pin.mutable_pin()->set_model("a");
  pin.mutable_pin()->set_pin(true);
  Ask(rig, 3, pin);
  rig.Forget();
  v1::Envelope load;
  load.mutable_load()->set_model("b");
  v1::Envelope reply = Ask(rig, 5, load);
  ASSERT_TRUE(reply.has_error()) << reply.DebugString();
  EXPECT_TRUE(Contains(reply.error().message(), "single_active")) << reply.error().message();
  EXPECT_FALSE(Contains(reply.error().message(), "budget")) << reply.error().message();
}

TEST(CoreTruthTest, ReRegisteringAModelsDirectoryModelNamesTheDirectory) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry a = Entry("a", 300, 50);
  a.from_models_dir = true;
  rig.Start({a});
  v1::Envelope reg;
  reg.mutable_register_model()->set_model("a");
  reg.mutable_register_model()->set_path("/elsewhere/a.safetensors");
  event::ClientRequest r;
  r.session = 6;
  r.admin = true;
  r.envelope = reg;
  r.envelope.set_request_id(1);
  r.registration = Result<ModelEntry>(Entry("a", 100, 10));
  rig.Handle(std::move(r));
  std::vector<v1::Envelope> replies = rig.Replies(6);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].has_error());
  EXPECT_TRUE(Contains(replies[0].error().message(), "models directory (/models/a.safetensors)"))
      << replies[0].error().message();
  EXPECT_FALSE(Contains(replies[0].error().message(), "configuration")) << replies[0].error().message();
}

TEST(CoreTruthTest, ABrokenFileIsCalledBrokenNotRetried) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry a = Entry("a", 300, 50);
  a.problem = Error(Code::kInvalidArgument, "model file \"/models/a.safetensors\": header is not JSON");
  a.problem_in_file = true;  // the registry's verdict (registry.cc; model_roots_test checks it)
  rig.Start({a});
  rig.Up(0);
  rig.Up(1);
  rig.Forget();
  rig.Infer(7, "a");
  // The file is looked at again (by the shell), and is still broken.
  event::ModelInspected inspected;
  inspected.model = rig.index().Find("a");
  inspected.path = a.path;
  inspected.resolved = a.path;
  inspected.entry = a;
  rig.Handle(std::move(inspected));
  std::vector<v1::Envelope> replies = rig.Replies(7);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].has_error());
  const std::string& message = replies[0].error().message();
  EXPECT_TRUE(Contains(message, "fix or replace /models/a.safetensors, then run 'warmpool load a'")) << message;
  EXPECT_FALSE(Contains(message, "retried in")) << message;
  const v1::PsEntry e = PsOf(rig, "a");
  EXPECT_TRUE(e.file_broken());
  EXPECT_TRUE(ModelOf(rig, "a").file_broken());
  // Later requests are told the same.
  rig.Infer(8, "a");
  replies = rig.Replies(8);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(Contains(replies[0].error().message(), "fix or replace")) << replies[0].error().message();
}

KeptWeights KeptReady(const ModelEntry& e, int handle) {
  KeptWeights k;
  k.name = e.name;
  k.engine = e.engine;
  k.path = e.path;
  k.weights.handle = handle;
  k.weights.header = e.header;
  k.weights.file_size = e.file_size;
  k.weights.version = e.version;
  k.weights.weight_bytes = e.weight_bytes;
  k.weights.workspace_bytes = e.workspace_bytes;
  return k;
}

TEST(CoreTruthTest, AdoptedModelsKeepTheirKeepAliveAndThePreloadCountCountsThePreloadList) {
  Config config = CoreRig::SmallConfig();
  config.keep_alive_ms = 500;
  config.preload = {"a"};
  CoreRig rig(config);
  ModelEntry a = Entry("a", 200, 50), b = Entry("b", 200, 50), c = Entry("c", 200, 50);
  rig.Start({a, b, c}, {KeptReady(b, 101), KeptReady(c, 102)});
  ASSERT_EQ(rig.core().adopted(), 2u);
  EXPECT_TRUE(PsOf(rig, "b").has_expiry()) << "an adopted model counts down like any other";
  rig.Up(0);
  rig.Up(1);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0), to1 = rig.Sent(1);
  const uint32_t slot = to0.empty() ? 1 : 0;
  if (to0.empty()) to0 = to1;
  ASSERT_EQ(to0.size(), 1u);
  ASSERT_TRUE(to0[0].has_load());
  rig.Reply(slot, CoreRig::LoadDone(to0[0].load().job(), a), {100});
  rig.Advance(kStatusPeriodMs);
  EXPECT_TRUE(Contains(rig.Logs(), "preload complete: 1 of 1 preloaded model(s) ready (2 adopted across the restart)"))
      << rig.Logs();
  rig.Forget();
  rig.Advance(1000);
  EXPECT_NE(rig.State("b"), shm::ModelState::kReady) << "b expired";
  EXPECT_TRUE(Contains(rig.Logs(), "releasing \"b\" (keep_alive")) << rig.Logs();
}

TEST(CoreTruthTest, KeepAliveZeroSparesPreloadedAndAdoptedModelsUntilTheirFirstRequestEnds) {
  Config config = CoreRig::SmallConfig();
  config.keep_alive_ms = 0;
  config.preload = {"a"};
  CoreRig rig(config);
  ModelEntry a = Entry("a", 200, 50), b = Entry("b", 200, 50);
  rig.Start({a, b}, {KeptReady(b, 101)});
  rig.Up(0);
  rig.Up(1);
  std::vector<v1::WorkerEnvelope> to0 = rig.Sent(0), to1 = rig.Sent(1);
  const uint32_t slot = to0.empty() ? 1 : 0;
  if (to0.empty()) to0 = to1;
  ASSERT_EQ(to0.size(), 1u);
  ASSERT_TRUE(to0[0].has_load());
  rig.Reply(slot, CoreRig::LoadDone(to0[0].load().job(), a), {100});
  rig.Advance(1000);
  EXPECT_EQ(rig.State("a"), shm::ModelState::kReady) << "a preload nobody has asked for yet stays";
  EXPECT_EQ(rig.State("b"), shm::ModelState::kReady) << "so do weights adopted across a restart";
  EXPECT_FALSE(PsOf(rig, "a").has_expiry());

  // Its first request ends: keep_alive 0 applies from then on.
  rig.Forget();
  rig.Infer(2, "a");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(slot);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_infer());
  rig.Reply(slot, CoreRig::InferDone(sent[0].infer().job()));
  rig.Advance(kTickMs);
  EXPECT_EQ(rig.State("a"), shm::ModelState::kUnloading);
  EXPECT_EQ(rig.State("b"), shm::ModelState::kReady);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
