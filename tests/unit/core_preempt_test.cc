// A generation its engine preempts for room in the KV cache (engine ABI version 13): the core tells
// the worker which generations it can resume (WorkerInfer.preemptible: a stream without tools,
// whose chunks are tokens, or no stream at all); one handed back after chunks waits in the queue as
// a refused one does, unanswered, and goes on after the tokens its client has, its chunks numbered
// on, its arrival the same as first (its engine preempts the latest to arrive first); one whose
// client has text it cannot resume after is answered with the preemption's error.
#include "tests/unit/core_generations.h"

namespace warmpool::supervisor::testing {
namespace {

class CorePreemptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lm_.sequences = 3;
    lm_.tool_call_format = "hermes";  // it takes tools
    rig_.Start({lm_});
    rig_.Up(0);
    rig_.Loaded(0, lm_, 100);
    rig_.Forget();
  }
  std::vector<v1::WorkerEnvelope> Sent() {
    std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
    for (const v1::WorkerEnvelope& m : sent) EXPECT_TRUE(m.has_infer() && m.infer().has_generate()) << m.DebugString();
    return sent;
  }
  CoreRig rig_{CoreRig::SmallConfig()};
  ModelEntry lm_ = LanguageModel("lm");
};

TEST_F(CorePreemptTest, TheWorkerIsToldWhichGenerationsItsEngineMayPreempt) {
  Generate(rig_, 5, "lm", /*stream=*/true);
  Generate(rig_, 6, "lm", /*stream=*/false);
  Generate(rig_, 7, "lm", /*stream=*/true, /*deadline_ms=*/0, /*tools=*/true);
  std::vector<v1::WorkerEnvelope> sent = Sent();
  ASSERT_EQ(sent.size(), 3u);
  EXPECT_TRUE(sent[0].infer().preemptible()) << "a stream of tokens resumes after them";
  EXPECT_TRUE(sent[1].infer().preemptible()) << "no stream: its client has nothing yet";
  EXPECT_FALSE(sent[2].infer().preemptible()) << "a stream with tools cannot be resumed";
}

TEST_F(CorePreemptTest, APreemptedStreamGoesOnAfterTheTokensItsClientHas) {
  Generate(rig_, 5, "lm");
  rig_.Advance(5);
  Generate(rig_, 6, "lm");
  std::vector<v1::WorkerEnvelope> sent = Sent();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_LT(sent[0].infer().arrival_ms(), sent[1].infer().arrival_ms()) << "the engine is told who came first";
  const uint64_t older = sent[0].infer().job(), younger = sent[1].infer().job();
  rig_.Reply(0, Chunk(younger, "a", 0, {11}));
  rig_.Reply(0, Chunk(younger, "b", 1, {12}));
  rig_.Reply(0, NoKvRoom(younger, /*needed=*/2, /*reserved=*/3, /*blocks=*/4, /*preempted=*/true));
  std::vector<v1::Envelope> so_far = rig_.Replies(6);
  ASSERT_EQ(so_far.size(), 2u) << "its two chunks, and no answer: it waits";
  const shm::ModelStats& stats = rig_.view().model_stats(rig_.index().Find("lm"));
  EXPECT_EQ(stats.kv_cache_waits, 1u);
  EXPECT_EQ(stats.kv_cache_preemptions, 1u);
  EXPECT_TRUE(Sent().empty()) << "one block free, two needed";
  Generate(rig_, 7, "lm");
  EXPECT_TRUE(Sent().empty()) << "a later request does not pass it";

  rig_.Reply(0, DoneSaying(older, /*reserved=*/0));
  std::vector<v1::WorkerEnvelope> again = Sent();
  ASSERT_EQ(again.size(), 2u) << "the preempted one, then the later one";
  const v1::WorkerInfer& resumed = again[0].infer();
  EXPECT_EQ(std::vector<int32_t>(resumed.resume_tokens().begin(), resumed.resume_tokens().end()),
            (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(resumed.arrival_ms(), sent[1].infer().arrival_ms()) << "resumed, it keeps its place";
  rig_.Reply(0, Chunk(resumed.job(), "c", 0, {13}));
  rig_.Reply(0, Done(resumed.job()));
  std::vector<v1::Envelope> rest = rig_.Replies(6);
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].generate_chunk().index(), 2u) << "numbered on from the chunks before";
  EXPECT_EQ(rest[0].generate_chunk().text(), "c");
  ASSERT_TRUE(rest[1].has_generate_reply()) << rest[1].DebugString();
  EXPECT_EQ(rest[1].generate_reply().chunks(), 3u);
  rig_.Reply(0, Done(again[1].infer().job()));
  EXPECT_EQ(rig_.Replies(7).size(), 1u);
}

TEST_F(CorePreemptTest, APreemptedStreamWhoseClientHasTextAloneIsAnsweredWithTheError) {
  Generate(rig_, 5, "lm");
  Generate(rig_, 6, "lm");
  std::vector<v1::WorkerEnvelope> sent = Sent();
  ASSERT_EQ(sent.size(), 2u);
  const uint64_t younger = sent[1].infer().job();
  rig_.Reply(0, Chunk(younger, "a", 0, {11}));
  rig_.Reply(0, Chunk(younger, " held back", 1));  // text with no token: nothing to resume after
  rig_.Reply(0, NoKvRoom(younger, /*needed=*/2, /*reserved=*/3, /*blocks=*/4, /*preempted=*/true));
  std::vector<v1::Envelope> replies = rig_.Replies(6);
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[2].error().code(), v1::RESOURCE_EXHAUSTED) << replies[2].DebugString();
  rig_.Reply(0, DoneSaying(sent[0].infer().job(), /*reserved=*/0));
  EXPECT_TRUE(Sent().empty()) << "nothing sent again";
  EXPECT_EQ(rig_.Replies(5).size(), 1u);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
