// Generations at once on a replica (continuous batching, supervisor/core/dispatch.cc): as many as
// its engine runs, its KV cache counted as configured ([[models]] parallel, kv_cache_tokens), and
// a generation the replica's KV cache has no room for (engine ABI version 12) sent back to wait at
// the front of the queue, unanswered, until a replica says it has the room or runs none of the
// model's generations; nothing passes it meanwhile.
#include "tests/unit/core_generations.h"

namespace warmpool::supervisor::testing {
namespace {

// The small configuration with a [[models]] entry for "lm" of these settings.
Config WithLm(ModelConfig lm) {
  lm.name = "lm";
  Config config = CoreRig::SmallConfig();
  config.models.push_back(std::move(lm));
  return config;
}

// The first model as `models` shows it.
v1::ModelInfo FirstModel(CoreRig& rig) {
  v1::Envelope models;
  models.mutable_models();
  rig.Request(9, std::move(models));
  std::vector<v1::Envelope> replies = rig.Replies(9);
  EXPECT_EQ(replies.size(), 1u);
  return replies.empty() ? v1::ModelInfo() : replies[0].models_reply().models(0);
}

// A worker runs as many generations at once as its engine says (Weights::sequences, continuous
// batching); one more waits in the daemon, and goes when one of them ends.
TEST(CoreParallelTest, AReplicaGetsAsManyGenerationsAsItsEngineRunsAtOnceAndTheRestWait) {
  CoreRig rig{CoreRig::SmallConfig()};
  ModelEntry lm = LanguageModel("lm");
  lm.sequences = 2;
  rig.Start({lm});
  rig.Up(0);
  rig.Loaded(0, lm, 100);
  rig.Forget();
  for (int i = 0; i < 3; i++) Generate(rig, 5, "lm");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 2u) << "two run together; the third waits in the daemon";
  rig.Reply(0, Done(sent[0].infer().job()));
  std::vector<v1::WorkerEnvelope> next = rig.Sent(0);
  ASSERT_EQ(next.size(), 1u) << "one ended: the third goes";
  EXPECT_TRUE(next[0].infer().has_generate());
  rig.Reply(0, Done(sent[1].infer().job()));
  rig.Reply(0, Done(next[0].infer().job()));
  EXPECT_EQ(rig.Replies(5).size(), 3u);
}

// [[models]] parallel moves the KV caches admission counts (a whole context each) and asks the
// load for that many; a worker's report (one on a GPU, say) is what the next admission counts.
TEST(CoreParallelTest, ParallelSetsTheCachesAdmissionCountsAndTheLoadAsksFor) {
  const Config config = WithLm({.parallel = 2});
  CoreRig rig{config};
  ModelEntry lm = LanguageModel("lm");
  lm.kv_bytes_per_token = 2;  // a 64-token context: 128 bytes a cache
  lm.sequences = 4;
  lm.workspace_bytes = 10 + 4 * 128;
  rig.Start({lm});
  rig.Up(0);
  auto info = [&] { return FirstModel(rig); };
  EXPECT_EQ(info().parallel(), 2u);
  EXPECT_EQ(info().workspace_bytes(), 10u + 2 * 128) << "two caches, not the registration's four";
  rig.Load(1, "lm");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_load());
  EXPECT_EQ(sent[0].load().sequences(), 2u);
  ModelEntry reported = lm;  // the engine runs one (a GPU's forward pass)
  reported.sequences = 1;
  reported.workspace_bytes = 10 + 128;
  rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), reported), {100});
  EXPECT_EQ(info().parallel(), 1u);
  EXPECT_EQ(info().workspace_bytes(), 10u + 128);
  event::Reload same;  // the same settings and files, applied again
  same.config = config;
  same.entries = {lm};
  rig.Handle(std::move(same));
  EXPECT_EQ(info().parallel(), 1u) << "the engine's figure stays: the settings did not change";
  EXPECT_EQ(info().workspace_bytes(), 10u + 128);
}

// The engine keeps its cache in the element it chooses where it runs (bf16 where the CPU can, f32
// on a GPU), which registration cannot know: its report's bytes a position are what admission
// counts from then on, in `models` and when [[models]] parallel changes.
TEST(CoreParallelTest, TheEnginesBytesAPositionReplaceTheRegistrations) {
  CoreRig rig{WithLm({.parallel = 2})};
  ModelEntry lm = LanguageModel("lm");
  lm.kv_bytes_per_token = 4;  // a 64-token context: 256 bytes a cache, as registration counts
  lm.sequences = 2;
  lm.workspace_bytes = 10 + 2 * 256;
  rig.Start({lm});
  rig.Up(0);
  rig.Load(1, "lm");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ModelEntry reported = lm;  // half the bytes a position
  reported.kv_bytes_per_token = 2;
  reported.workspace_bytes = 10 + 2 * 128;
  rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), reported), {100});
  EXPECT_EQ(FirstModel(rig).kv_bytes_per_token(), 2u);
  EXPECT_EQ(FirstModel(rig).workspace_bytes(), 10u + 2 * 128);
  event::Reload more;
  more.config = WithLm({.parallel = 3});
  more.entries = {lm};
  rig.Handle(std::move(more));
  rig.Forget();
  rig.Unload(2, "lm");  // unloaded, `models` shows what the next load is counted for
  std::vector<v1::WorkerEnvelope> unload = rig.Sent(0);
  ASSERT_EQ(unload.size(), 1u);
  rig.Reply(0, CoreRig::UnloadDone(unload[0].unload().job()));
  EXPECT_EQ(FirstModel(rig).parallel(), 3u);
  EXPECT_EQ(FirstModel(rig).workspace_bytes(), 10u + 3 * 128) << "three caches of the engine's bytes a position";
}

// [[models]] kv_cache_tokens: the caches share that many positions, at least one context and at
// most all of theirs, counted by admission and asked of the load; the engine's report (whole
// blocks) is what the next admission counts, and applying the same settings again keeps it.
TEST(CoreParallelTest, KvCacheTokensSetThePositionsAdmissionCountsAndTheLoadAsksFor) {
  for (const auto& [asked, counted] : std::vector<std::pair<uint64_t, uint64_t>>{{100, 100}, {10, 64}, {1000, 128}}) {
    const Config config = WithLm({.parallel = 2, .kv_cache_tokens = asked});
    CoreRig rig{config};
    ModelEntry lm = LanguageModel("lm");
    lm.kv_bytes_per_token = 2;  // a 64-token context
    lm.sequences = 4;
    lm.workspace_bytes = 10 + 4 * 128;
    rig.Start({lm});
    rig.Up(0);
    v1::Envelope models;
    models.mutable_models();
    rig.Request(9, std::move(models));
    std::vector<v1::Envelope> replies = rig.Replies(9);
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].models_reply().models(0).kv_cache_tokens(), counted) << "asked " << asked;
    EXPECT_EQ(replies[0].models_reply().models(0).workspace_bytes(), 10 + 2 * counted) << "asked " << asked;
    rig.Load(1, "lm");
    std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].load().kv_tokens(), counted);
    ModelEntry reported = lm;
    reported.sequences = 2;
    reported.kv_tokens = (counted + 63) / 64 * 64;
    reported.workspace_bytes = 10 + 2 * reported.kv_tokens;
    rig.Reply(0, CoreRig::LoadDone(sent[0].load().job(), reported), {100});
    event::Reload same;  // the same settings and files, applied again
    same.config = config;
    same.entries = {lm};
    rig.Handle(std::move(same));
    v1::Envelope again;
    again.mutable_models();
    rig.Request(9, std::move(again));
    replies = rig.Replies(9);
    ASSERT_EQ(replies.size(), 1u);
    EXPECT_EQ(replies[0].models_reply().models(0).kv_cache_tokens(), reported.kv_tokens) << "asked " << asked;
    EXPECT_EQ(replies[0].models_reply().models(0).workspace_bytes(), reported.workspace_bytes) << "asked " << asked;
  }
}


class CoreKvRoomTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lm_.sequences = 3;
    rig_.Start({lm_});
    rig_.Up(0);
    rig_.Loaded(0, lm_, 100);
    rig_.Forget();
  }
  std::vector<uint64_t> JobsSent() {
    std::vector<uint64_t> jobs;
    for (const v1::WorkerEnvelope& m : rig_.Sent(0)) {
      EXPECT_TRUE(m.has_infer() && m.infer().has_generate()) << m.DebugString();
      jobs.push_back(m.infer().job());
    }
    return jobs;
  }
  uint64_t Waits() { return rig_.view().model_stats(rig_.index().Find("lm")).kv_cache_waits; }
  CoreRig rig_{CoreRig::SmallConfig()};
  ModelEntry lm_ = LanguageModel("lm");
};

TEST_F(CoreKvRoomTest, AGenerationWithoutRoomWaitsAtTheFrontUntilTheReplicaSaysItHasTheRoom) {
  for (uint64_t session : {5, 6, 7}) Generate(rig_, session, "lm");
  std::vector<uint64_t> sent = JobsSent();
  ASSERT_EQ(sent.size(), 3u);
  rig_.Reply(0, NoKvRoom(sent[1], /*needed=*/3, /*reserved=*/2));
  EXPECT_TRUE(rig_.Replies(6).empty()) << "not an answer: it waits";
  EXPECT_TRUE(rig_.Sent(0).empty()) << "two blocks free, three needed";
  EXPECT_EQ(Waits(), 1u);
  Generate(rig_, 8, "lm");
  EXPECT_TRUE(rig_.Sent(0).empty()) << "a later request does not pass the one waiting for room";

  rig_.Reply(0, DoneSaying(sent[0], /*reserved=*/1));  // three blocks free now
  std::vector<v1::WorkerEnvelope> again = rig_.Sent(0);
  ASSERT_EQ(again.size(), 2u) << "the one that waited, then the later one";
  EXPECT_TRUE(again[0].infer().batch());
  // Each client gets its one answer: the first sent again is the one that waited.
  rig_.Reply(0, Done(again[0].infer().job()));
  std::vector<v1::Envelope> waited = rig_.Replies(6);
  ASSERT_EQ(waited.size(), 1u);
  EXPECT_TRUE(waited[0].has_generate_reply()) << waited[0].DebugString();
  rig_.Reply(0, Done(again[1].infer().job()));
  EXPECT_EQ(rig_.Replies(8).size(), 1u);
  rig_.Reply(0, Done(sent[2]));
  for (uint64_t session : {5, 7}) EXPECT_EQ(rig_.Replies(session).size(), 1u) << "session " << session;
}

TEST_F(CoreKvRoomTest, OneWaitingForRoomGoesOnceTheReplicaRunsNoneOfTheModelsGenerations) {
  Generate(rig_, 5, "lm");
  Generate(rig_, 6, "lm");
  std::vector<uint64_t> sent = JobsSent();
  ASSERT_EQ(sent.size(), 2u);
  rig_.Reply(0, NoKvRoom(sent[1], /*needed=*/4, /*reserved=*/2));
  rig_.Reply(0, Done(sent[0]));  // says nothing of its cache: whatever it said last, it is all free
  std::vector<uint64_t> again = JobsSent();
  ASSERT_EQ(again.size(), 1u);
  rig_.Reply(0, Done(again[0]));
  ASSERT_EQ(rig_.Replies(6).size(), 1u);
}

TEST_F(CoreKvRoomTest, RefusedWithNothingElseOnTheReplicaTheRefusalIsTheAnswer) {
  Generate(rig_, 5, "lm");
  std::vector<uint64_t> sent = JobsSent();
  ASSERT_EQ(sent.size(), 1u);
  rig_.Reply(0, NoKvRoom(sent[0], /*needed=*/4, /*reserved=*/0));
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(rig_.Sent(0).empty());
  EXPECT_EQ(Waits(), 0u);
}

TEST_F(CoreKvRoomTest, RefusedOnesGoAgainInTheirOrderAheadOfLaterRequests) {
  for (uint64_t session : {5, 6, 7}) Generate(rig_, session, "lm");
  std::vector<uint64_t> sent = JobsSent();
  ASSERT_EQ(sent.size(), 3u);
  Generate(rig_, 8, "lm");
  rig_.Reply(0, NoKvRoom(sent[1], 2, 3));
  rig_.Reply(0, NoKvRoom(sent[2], 1, 3));
  rig_.Reply(0, DoneSaying(sent[0], /*reserved=*/0));
  std::vector<v1::WorkerEnvelope> again = rig_.Sent(0);
  ASSERT_EQ(again.size(), 3u);
  std::vector<uint64_t> sessions;
  for (const v1::WorkerEnvelope& m : again) {
    rig_.Reply(0, Done(m.infer().job()));
    for (uint64_t session : {6, 7, 8}) {
      if (!rig_.Replies(session).empty()) sessions.push_back(session);
    }
  }
  EXPECT_EQ(sessions, (std::vector<uint64_t>{6, 7, 8}));
}

// [[models]] prefill_stretch goes to the engine with the load, and with the weights' description
// to a replica that attaches them.
TEST(CoreParallelTest, PrefillStretchGoesWithTheLoadAndTheWeightsAnAttachOpens) {
  CoreRig rig{WithLm({.prefill_stretch = 3.5f})};
  ModelEntry lm = LanguageModel("lm");
  lm.sequences = 2;
  rig.Start({lm});
  rig.Up(0);
  rig.Up(1);
  rig.Load(1, "lm", /*replicas=*/2);
  std::vector<v1::WorkerEnvelope> load = rig.Sent(0);
  ASSERT_EQ(load.size(), 1u);
  EXPECT_EQ(load[0].load().prefill_stretch(), 3.5f);
  ModelEntry loaded = lm;
  loaded.prefill_stretch = 3.5f;  // the worker says what its engine opened with
  rig.Reply(0, CoreRig::LoadDone(load[0].load().job(), loaded), {100});
  std::vector<v1::WorkerEnvelope> attach = rig.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  ASSERT_TRUE(attach[0].has_attach());
  EXPECT_EQ(attach[0].attach().weights().prefill_stretch(), 3.5f);
}

// Of two replicas equally busy, a generation goes to the one whose KV cache has the most room free
// of what its generations may need, as each last said.
TEST(CoreKvRoomPlacementTest, OfReplicasEquallyBusyTheOneWithTheMostRoomTakesAGeneration) {
  for (uint64_t second_reserved : {1u, 5u}) {
    CoreRig rig{CoreRig::SmallConfig()};
    ModelEntry lm = LanguageModel("lm");
    lm.sequences = 3;
    rig.Start({lm});
    rig.Up(0);
    rig.Up(1);
    auto load_done = [&](uint64_t job) {  // a cache of 8 blocks, all free
      v1::WorkerEnvelope done = CoreRig::LoadDone(job, lm);
      done.mutable_load_done()->mutable_kv_usage()->set_blocks(8);
      return done;
    };
    rig.Load(1, "lm", /*replicas=*/2);
    std::vector<v1::WorkerEnvelope> load = rig.Sent(0);
    ASSERT_EQ(load.size(), 1u);
    rig.Reply(0, load_done(load[0].load().job()), {100});
    std::vector<v1::WorkerEnvelope> attach = rig.Sent(1);
    ASSERT_EQ(attach.size(), 1u);
    ASSERT_TRUE(attach[0].has_attach()) << attach[0].DebugString();
    rig.Reply(1, load_done(attach[0].attach().job()));
    rig.Forget();
    // One generation on each (the less busy takes the second), each saying what it reserved.
    auto run_one = [&](uint64_t session, uint64_t reserved) -> uint32_t {
      Generate(rig, session, "lm");
      for (uint32_t slot : {0u, 1u}) {
        std::vector<v1::WorkerEnvelope> sent = rig.Sent(slot);
        if (sent.empty()) continue;
        v1::WorkerEnvelope chunk = Chunk(sent[0].infer().job(), "a", 0, {1});
        chunk.mutable_infer_chunk()->mutable_kv_usage()->set_blocks(8);
        chunk.mutable_infer_chunk()->mutable_kv_usage()->set_blocks_reserved(reserved);
        rig.Reply(slot, chunk);
        return slot;
      }
      ADD_FAILURE() << "generation of session " << session << " sent nowhere";
      return 0;
    };
    const uint32_t first = run_one(5, 3);  // 5 blocks free
    const uint32_t second = run_one(6, second_reserved);
    ASSERT_NE(first, second) << "the less busy replica took the second";
    Generate(rig, 7, "lm");
    const uint32_t roomy = second_reserved < 3 ? second : first;
    EXPECT_EQ(rig.Sent(roomy).size(), 1u) << "worker " << roomy << " has the most room";
    EXPECT_TRUE(rig.Sent(1 - roomy).empty());
  }
}

// A stream retried after its worker's death that a replica's KV cache has no room for: no new
// generation passes it (they would take the room it waits for), and it goes first once there is.
TEST(CoreKvRoomRetryTest, NoNewGenerationPassesARetryWaitingForRoom) {
  CoreRig rig{CoreRig::SmallConfig()};
  ModelEntry lm = LanguageModel("lm");
  lm.sequences = 3;
  rig.Start({lm});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, lm, 100);
  rig.Forget();
  Generate(rig, 5, "lm");
  Generate(rig, 6, "lm");
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 2u);
  rig.Down(0);  // neither had begun: both retried sharing their engine's steps (batch)
  std::vector<v1::WorkerEnvelope> attach = rig.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  ASSERT_TRUE(attach[0].has_attach()) << attach[0].DebugString();
  rig.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm));
  std::vector<v1::WorkerEnvelope> retried = rig.Sent(1);
  ASSERT_EQ(retried.size(), 1u) << "retries go one at a time";
  ASSERT_TRUE(retried[0].infer().batch());
  Generate(rig, 7, "lm");  // a new one passes retries that wait their turn
  std::vector<v1::WorkerEnvelope> passing = rig.Sent(1);
  ASSERT_EQ(passing.size(), 1u);
  rig.Reply(1, Done(retried[0].infer().job()));
  const uint64_t first_session = rig.Replies(5).empty() ? 6 : 5;  // the session whose retry went first
  const uint64_t waiting = 11 - first_session;
  std::vector<v1::WorkerEnvelope> second = rig.Sent(1);
  ASSERT_EQ(second.size(), 1u) << "the other retry's turn";
  ASSERT_TRUE(second[0].infer().batch());
  rig.Reply(1, NoKvRoom(second[0].infer().job(), /*needed=*/3, /*reserved=*/2));
  EXPECT_TRUE(rig.Replies(waiting).empty()) << "it waits for room";

  Generate(rig, 8, "lm");
  EXPECT_TRUE(rig.Sent(1).empty()) << "a new generation does not pass the retry waiting for room";
  rig.Reply(1, DoneSaying(passing[0].infer().job(), /*reserved=*/0));
  std::vector<v1::WorkerEnvelope> after = rig.Sent(1);
  ASSERT_EQ(after.size(), 2u) << "the retry, then the new one";
  rig.Reply(1, Done(after[0].infer().job()));
  EXPECT_EQ(rig.Replies(waiting).size(), 1u) << "the first sent was the retry";
  rig.Reply(1, Done(after[1].infer().job()));
  EXPECT_EQ(rig.Replies(8).size(), 1u);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
