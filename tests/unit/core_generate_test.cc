// Generations in the core (supervisor/core/generate.cc): a client gets the chunks in order, then
// exactly one final reply, and nothing after it — whatever the worker does meanwhile: dies before
// or after a chunk went out (the stream then resumes elsewhere after the tokens sent), answers
// late, or keeps sending after the client left or the deadline passed.
#include "tests/unit/core_generations.h"

namespace warmpool::supervisor::testing {
namespace {

class CoreGenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lm_.tool_call_format = "hermes";  // its template shows how it calls tools
    rig_.Start({lm_, Entry("dense", 100, 10)});
    rig_.Up(0);
    rig_.Up(1);
    rig_.Loaded(0, lm_, 100);
    rig_.Forget();
  }
  // The generation the worker of `slot` got.
  uint64_t JobSentTo(uint32_t slot) {
    std::vector<v1::WorkerEnvelope> sent = rig_.Sent(slot);
    EXPECT_EQ(sent.size(), 1u);
    if (sent.empty()) return 0;
    EXPECT_TRUE(sent[0].has_infer() && sent[0].infer().has_generate()) << sent[0].DebugString();
    EXPECT_TRUE(sent[0].infer().batch()) << "a first run shares its engine's steps with others";
    return sent[0].infer().job();
  }
  CoreRig rig_{CoreRig::SmallConfig()};
  ModelEntry lm_ = LanguageModel("lm");
};

TEST_F(CoreGenerateTest, ChunksGoOutInOrderNumberedByTheCoreThenOneFinalAndNothingAfter) {
  const uint64_t request = Generate(rig_, 5, "lm");
  const uint64_t job = JobSentTo(0);
  rig_.Reply(0, Chunk(job, "Hel", 7));
  rig_.Reply(0, Chunk(job, "lo", 3));
  rig_.Reply(0, Done(job));
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 3u);
  for (uint32_t i = 0; i < 2; i++) {
    ASSERT_TRUE(replies[i].has_generate_chunk()) << replies[i].DebugString();
    EXPECT_EQ(replies[i].request_id(), request);
    EXPECT_EQ(replies[i].generate_chunk().index(), i) << "the core's numbering, not the worker's";
  }
  EXPECT_EQ(replies[0].generate_chunk().text(), "Hel");
  ASSERT_TRUE(replies[2].has_generate_reply()) << replies[2].DebugString();
  EXPECT_EQ(replies[2].generate_reply().chunks(), 2u);
  EXPECT_EQ(replies[2].generate_reply().finish_reason(), "length");
  // A chunk after the final is a worker that lies about its jobs: killed, and the client hears nothing.
  rig_.Reply(0, Chunk(job, "late"));
  EXPECT_TRUE(rig_.Replies(5).empty());
  EXPECT_EQ(rig_.Count<action::KillWorker>(), 1u);
}

TEST_F(CoreGenerateTest, WithoutStreamOnlyTheFinalReplyGoesOut) {
  Generate(rig_, 5, "lm", /*stream=*/false);
  const uint64_t job = JobSentTo(0);
  v1::WorkerEnvelope heartbeat;
  heartbeat.mutable_infer_chunk()->set_job(job);  // a step, no chunk
  rig_.Reply(0, heartbeat);
  rig_.Reply(0, Chunk(job, "stray"));
  rig_.Reply(0, Done(job));
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_generate_reply());
}

TEST_F(CoreGenerateTest, TensorsToALanguageModelAndTextToADenseOneAreRefusedBeforeAnyWorker) {
  rig_.Infer(5, "lm");
  Generate(rig_, 5, "dense");
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].error().code(), v1::FAILED_PRECONDITION);
  EXPECT_NE(replies[0].error().message().find("generate"), std::string::npos) << replies[0].error().message();
  EXPECT_EQ(replies[1].error().code(), v1::FAILED_PRECONDITION);
  EXPECT_TRUE(rig_.Sent(0).empty());
  EXPECT_TRUE(rig_.Sent(1).empty());
}

// Part of the stream is the client's: the generation goes on on another worker after the tokens
// sent (resume_tokens), alone, its chunks numbered on from where they stopped.
TEST_F(CoreGenerateTest, AWorkerThatDiesAfterAChunkHasTheStreamResumeElsewhereAfterItsTokens) {
  rig_.Load(1, "lm", /*replicas=*/2);
  std::vector<v1::WorkerEnvelope> attach = rig_.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  rig_.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm_));
  rig_.Forget();
  Generate(rig_, 5, "lm");
  std::vector<v1::WorkerEnvelope> first = rig_.Sent(0);
  const uint32_t slot = first.empty() ? 1 : 0;
  const uint64_t job = (first.empty() ? rig_.Sent(1) : first).at(0).infer().job();
  rig_.Reply(slot, Chunk(job, "Hel", 0, {11, 12}));
  rig_.Reply(slot, Chunk(job, "", 1, {13}));  // a token whose text is held back
  rig_.Down(slot, {job});
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 2u) << "the two chunks, and no error";
  const v1::WorkerInfer* resumed = nullptr;
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(1 - slot);
  for (const v1::WorkerEnvelope& m : sent) {
    if (m.has_infer() && m.infer().has_generate()) resumed = &m.infer();
  }
  ASSERT_NE(resumed, nullptr) << "it goes on on the other replica";
  EXPECT_EQ(std::vector<int32_t>(resumed->resume_tokens().begin(), resumed->resume_tokens().end()),
            (std::vector<int32_t>{11, 12, 13}));
  EXPECT_FALSE(resumed->batch()) << "it was running when a worker died: it runs alone now";
  rig_.Reply(1 - slot, Chunk(resumed->job(), "lo", 0, {14}));
  rig_.Reply(1 - slot, Done(resumed->job()));
  replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].generate_chunk().index(), 2u) << "numbered on from the chunks sent";
  EXPECT_EQ(replies[1].generate_reply().chunks(), 3u);
}

// A chunk of text alone (an engine's held-back tail at the end) is not covered by the tokens sent:
// resumed after them, the engine would send it again. The stream ends with an error instead.
TEST_F(CoreGenerateTest, AWorkerThatDiesAfterAChunkOfTextAloneEndsItsStreamWithAnError) {
  Generate(rig_, 5, "lm");
  const uint64_t job = JobSentTo(0);
  rig_.Reply(0, Chunk(job, "Hel", 0, {11}));
  rig_.Reply(0, Chunk(job, "lo"));  // no token: the tail
  rig_.Down(0, {job});
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[2].error().code(), v1::UNAVAILABLE) << replies[2].DebugString();
  for (const v1::WorkerEnvelope& m : rig_.Sent(1)) EXPECT_FALSE(m.has_infer()) << "not resumed";
}

// With tools the worker's reader of tool calls may hold text back that the core cannot know of:
// the stream ends with an error after what was sent.
TEST_F(CoreGenerateTest, AWorkerThatDiesAfterAChunkOfAGenerationWithToolsEndsItsStreamWithAnError) {
  Generate(rig_, 5, "lm", /*stream=*/true, /*deadline_ms=*/0, /*tools=*/true);
  const uint64_t job = JobSentTo(0);
  rig_.Reply(0, Chunk(job, "Hel"));
  rig_.Down(0, {job});
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_TRUE(replies[0].has_generate_chunk());
  EXPECT_EQ(replies[1].error().code(), v1::UNAVAILABLE) << replies[1].DebugString();
  EXPECT_NE(replies[1].error().message().find("after 1 chunks"), std::string::npos);
  for (const v1::WorkerEnvelope& m : rig_.Sent(1)) EXPECT_FALSE(m.has_infer()) << "not run again";
}

TEST_F(CoreGenerateTest, AWorkerThatDiesBeforeAnyChunkHasTheGenerationRunAgain) {
  rig_.Load(1, "lm", /*replicas=*/2);  // a second replica, attached on worker 1
  std::vector<v1::WorkerEnvelope> attach = rig_.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  ASSERT_TRUE(attach[0].has_attach());
  rig_.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm_));
  rig_.Forget();
  Generate(rig_, 5, "lm");
  std::vector<v1::WorkerEnvelope> first = rig_.Sent(0);
  std::vector<v1::WorkerEnvelope> second = rig_.Sent(1);
  const uint32_t slot = first.empty() ? 1 : 0;
  const uint64_t job = (first.empty() ? second : first).at(0).infer().job();
  rig_.Down(slot, {job});
  EXPECT_TRUE(rig_.Replies(5).empty()) << "nothing was sent yet: it runs again";
  std::vector<v1::WorkerEnvelope> retried = rig_.Sent(1 - slot);
  ASSERT_FALSE(retried.empty());
  bool found = false;
  for (const v1::WorkerEnvelope& m : retried) {
    if (m.has_infer() && m.infer().has_generate()) {
      found = true;
      EXPECT_EQ(m.infer().generate().prompt(), "once upon a time");
      EXPECT_FALSE(m.infer().batch()) << "it was running when a worker died: it runs alone now";
    }
  }
  EXPECT_TRUE(found);
}

TEST_F(CoreGenerateTest, AClientThatLeavesHasItsGenerationCancelledOnItsWorker) {
  Generate(rig_, 5, "lm");
  const uint64_t job = JobSentTo(0);
  rig_.Reply(0, Chunk(job, "Hel"));
  rig_.Forget();
  rig_.Handle(event::ClientGone{5});
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_cancel());
  EXPECT_EQ(sent[0].cancel().job(), job);
  rig_.Reply(0, Chunk(job, "lo"));
  rig_.Reply(0, Done(job, "cancelled"));
  EXPECT_TRUE(rig_.Replies(5).empty());
  EXPECT_EQ(rig_.Count<action::KillWorker>(), 0u);
  EXPECT_EQ(rig_.index().Get(rig_.index().Find("lm")).inflight, 0u);
}

TEST_F(CoreGenerateTest, ADeadlineEndsTheStreamAndWhatTheWorkerSendsLaterIsDropped) {
  Generate(rig_, 5, "lm", /*stream=*/true, /*deadline_ms=*/200);
  const uint64_t job = JobSentTo(0);
  rig_.Reply(0, Chunk(job, "Hel"));
  rig_.Advance(300);
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_TRUE(replies[0].has_generate_chunk());
  EXPECT_EQ(replies[1].error().code(), v1::DEADLINE_EXCEEDED);
  rig_.Reply(0, Chunk(job, "lo"));
  rig_.Reply(0, Done(job));
  EXPECT_TRUE(rig_.Replies(5).empty());
}

// A request queued behind a long generation on the same worker (an embedding: another generation
// would wait in the daemon for a free sequence) has not begun: its deadline answers it, but kills
// nobody; the worker skips it when its turn comes.
TEST_F(CoreGenerateTest, ADeadlineOfARequestQueuedBehindAGenerationKillsNoWorker) {
  Generate(rig_, 5, "lm");
  const uint64_t running = JobSentTo(0);
  v1::Envelope embed;
  embed.mutable_embed()->set_model("lm");
  embed.mutable_embed()->add_input("queued");
  embed.mutable_embed()->set_deadline_ms(200);
  rig_.Request(6, std::move(embed), /*admin=*/false);
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  const uint64_t queued = sent[0].infer().job();
  for (int step = 0; step < 30; step++) {
    rig_.Advance(100);
    rig_.Reply(0, Chunk(running, "."));
  }
  EXPECT_EQ(rig_.Count<action::KillWorker>(), 0u) << rig_.Logs();
  std::vector<v1::Envelope> late = rig_.Replies(6);
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].error().code(), v1::DEADLINE_EXCEEDED);
  // The generation ends; then the worker reaches the queued one, answers it at once, and lives.
  rig_.Reply(0, Done(running));
  rig_.Advance(CoreRig::SmallConfig().inference_grace_ms / 2);
  v1::WorkerEnvelope skipped;
  skipped.mutable_infer_done()->set_job(queued);
  skipped.mutable_infer_done()->mutable_error()->set_code(v1::DEADLINE_EXCEEDED);
  rig_.Reply(0, skipped);
  EXPECT_EQ(rig_.Count<action::KillWorker>(), 0u) << rig_.Logs();
  EXPECT_TRUE(rig_.Replies(6).empty());
  EXPECT_EQ(rig_.index().Get(rig_.index().Find("lm")).inflight, 0u);
}

TEST_F(CoreGenerateTest, AGenerationThatMakesNoStepForTheStallTimeKillsItsWorker) {
  Generate(rig_, 5, "lm");
  const uint64_t job = JobSentTo(0);
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms / 2);
  rig_.Reply(0, Chunk(job, "a"));
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms / 2 + 100);
  EXPECT_EQ(rig_.Count<action::KillWorker>(), 0u) << "the chunk was a step";
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms);
  ASSERT_EQ(rig_.Count<action::KillWorker>(), 1u);
  EXPECT_NE(rig_.Of<action::KillWorker>()[0].reason.find("generating"), std::string::npos);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
