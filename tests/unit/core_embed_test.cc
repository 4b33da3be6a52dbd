// Embed requests in the core (supervisor/core/embed.cc): an inference whose answer is vectors.
// Sent alone (never batched) to a worker of a language model, answered once, run again on another
// replica when its worker dies before answering, refused before any worker for a dense model or an
// input the context cannot hold.
#include "tests/unit/core_generations.h"

namespace warmpool::supervisor::testing {
namespace {

uint64_t SendEmbed(CoreRig& rig, uint64_t session, const std::string& model, std::vector<std::string> inputs) {
  v1::Envelope e;
  e.mutable_embed()->set_model(model);
  for (std::string& input : inputs) e.mutable_embed()->add_input(std::move(input));
  return rig.Request(session, std::move(e), /*admin=*/false);
}

v1::WorkerEnvelope EmbedDone(uint64_t job, uint32_t dimensions) {
  v1::WorkerEnvelope m;
  m.mutable_infer_done()->set_job(job);
  v1::EmbedReply* reply = m.mutable_infer_done()->mutable_embed();
  reply->set_dimensions(dimensions);
  v1::Embedding* embedding = reply->add_embeddings();
  for (uint32_t i = 0; i < dimensions; i++) embedding->add_values(0.5f);
  return m;
}

class CoreEmbedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rig_.Start({lm_, Entry("dense", 100, 10)});
    rig_.Up(0);
    rig_.Up(1);
    rig_.Loaded(0, lm_, 100);
    rig_.Forget();
  }
  CoreRig rig_{CoreRig::SmallConfig()};
  ModelEntry lm_ = LanguageModel("lm");
};

TEST_F(CoreEmbedTest, AnEmbedRequestRunsAloneOnAWorkerAndIsAnsweredOnce) {
  const uint64_t request = SendEmbed(rig_, 5, "lm", {"free software"});
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_infer() && sent[0].infer().has_embed()) << sent[0].DebugString();
  EXPECT_FALSE(sent[0].infer().batch());
  EXPECT_EQ(sent[0].infer().embed().input(0), "free software");
  const uint64_t job = sent[0].infer().job();
  rig_.Reply(0, EmbedDone(job, 4));
  rig_.Reply(0, EmbedDone(job, 4));  // a second answer for the same job: nothing more goes out
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].request_id(), request);
  ASSERT_TRUE(replies[0].has_embed_reply()) << replies[0].DebugString();
  EXPECT_EQ(replies[0].embed_reply().embeddings(0).values_size(), 4);
}

TEST_F(CoreEmbedTest, ADenseModelAndAnInputTheContextCannotHoldAreRefusedBeforeAnyWorker) {
  SendEmbed(rig_, 5, "dense", {"x"});
  SendEmbed(rig_, 5, "lm", {"fine", std::string(64 * 64 + 1, 'x')});
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[0].error().code(), v1::FAILED_PRECONDITION) << replies[0].DebugString();
  EXPECT_EQ(replies[1].error().code(), v1::INVALID_ARGUMENT) << replies[1].DebugString();
  EXPECT_NE(replies[1].error().message().find("input 1"), std::string::npos) << replies[1].error().message();
  EXPECT_TRUE(rig_.Sent(0).empty());
  EXPECT_TRUE(rig_.Sent(1).empty());
}

// dimensions: 1 to the model's embedding size (4 here), checked before any worker; within it, the
// worker gets it to shorten the vectors.
TEST_F(CoreEmbedTest, DimensionsPastTheModelsSizeAreRefusedBeforeAnyWorker) {
  v1::Envelope e;
  e.mutable_embed()->set_model("lm");
  e.mutable_embed()->add_input("free software");
  e.mutable_embed()->set_dimensions(5);
  rig_.Request(5, v1::Envelope(e), /*admin=*/false);
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::INVALID_ARGUMENT) << replies[0].DebugString();
  EXPECT_NE(replies[0].error().message().find("embeds in 4 values"), std::string::npos) << replies[0].error().message();
  EXPECT_TRUE(rig_.Sent(0).empty());
  e.mutable_embed()->set_dimensions(4);
  rig_.Request(5, std::move(e), /*admin=*/false);
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].infer().embed().dimensions(), 4u);
}

TEST_F(CoreEmbedTest, AWorkerThatDiesBeforeAnsweringHasTheRequestRunAgainOnAnotherReplica) {
  rig_.Load(1, "lm", /*replicas=*/2);
  std::vector<v1::WorkerEnvelope> attach = rig_.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  rig_.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm_));
  rig_.Forget();
  SendEmbed(rig_, 5, "lm", {"free software"});
  std::vector<v1::WorkerEnvelope> first = rig_.Sent(0);
  std::vector<v1::WorkerEnvelope> second = rig_.Sent(1);
  const uint32_t slot = first.empty() ? 1 : 0;
  const uint64_t job = (first.empty() ? second : first).at(0).infer().job();
  rig_.Down(slot, {job});
  EXPECT_TRUE(rig_.Replies(5).empty()) << "it runs again";
  uint64_t retried = 0;
  for (const v1::WorkerEnvelope& m : rig_.Sent(1 - slot)) {
    if (m.has_infer() && m.infer().has_embed()) {
      EXPECT_EQ(m.infer().embed().input(0), "free software");
      retried = m.infer().job();
    }
  }
  ASSERT_NE(retried, 0u);
  rig_.Reply(1 - slot, EmbedDone(retried, 4));
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_TRUE(replies[0].has_embed_reply());
}

// Judged as a generation: no default deadline, heartbeats between inputs are its steps, silence
// for the stall time kills its worker, a client that leaves cancels it.
TEST_F(CoreEmbedTest, AnEmbeddingIsJudgedByItsStepsAndCancelledWhenItsClientLeaves) {
  SendEmbed(rig_, 5, "lm", {"a"});
  uint64_t job = rig_.Sent(0).at(0).infer().job();
  EXPECT_EQ(rig_.Sent(0).size(), 0u);
  rig_.Advance(CoreRig::SmallConfig().default_deadline_ms * 2);
  EXPECT_TRUE(rig_.Replies(5).empty()) << "no default deadline";
  v1::WorkerEnvelope heartbeat;
  heartbeat.mutable_infer_chunk()->set_job(job);
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms / 2);
  rig_.Reply(0, heartbeat);
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms / 2 + 100);
  EXPECT_EQ(rig_.Count<action::KillWorker>(), 0u) << "the heartbeat was a step";
  rig_.Handle(event::ClientGone{5});
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_TRUE(sent[0].has_cancel());
  EXPECT_EQ(sent[0].cancel().job(), job);
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms);
  ASSERT_EQ(rig_.Count<action::KillWorker>(), 1u) << "silent past the stall time";
  EXPECT_NE(rig_.Of<action::KillWorker>()[0].reason.find("embedding"), std::string::npos);
}

TEST_F(CoreEmbedTest, AReplyThatWouldNotFitAFrameAndAChunkFromAnEmbeddingAreRefused) {
  ModelEntry wide = LanguageModel("wide");
  wide.embedding_size = 4096;  // 256 inputs: 4 MiB, over the rig's 1 MiB frames
  CoreRig rig{CoreRig::SmallConfig()};
  rig.Start({wide});
  rig.Up(0);
  rig.Loaded(0, wide, 100);
  rig.Forget();
  SendEmbed(rig, 5, "wide", std::vector<std::string>(256, "x"));
  std::vector<v1::Envelope> replies = rig.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::INVALID_ARGUMENT) << replies[0].DebugString();
  EXPECT_NE(replies[0].error().message().find("fewer inputs"), std::string::npos);

  // Registered without the size (a manifest of an older daemon): the load's report says it.
  ModelEntry unsized = LanguageModel("unsized");
  unsized.embedding_size = 0;
  ModelEntry as_read = unsized;
  as_read.embedding_size = 4096;
  CoreRig told{CoreRig::SmallConfig()};
  told.Start({unsized});
  told.Up(0);
  told.Loaded(0, as_read, 100);
  told.Forget();
  SendEmbed(told, 5, "unsized", std::vector<std::string>(256, "x"));
  replies = told.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::INVALID_ARGUMENT) << replies[0].DebugString();
  EXPECT_NE(replies[0].error().message().find("fewer inputs"), std::string::npos);
  SendEmbed(rig, 5, "wide", {"x"});
  const uint64_t job = rig.Sent(0).at(0).infer().job();
  v1::WorkerEnvelope chunk;
  chunk.mutable_infer_chunk()->set_job(job);
  chunk.mutable_infer_chunk()->mutable_chunk()->set_text("not an embedding's");
  rig.Reply(0, chunk);
  EXPECT_EQ(rig.Count<action::KillWorker>(), 1u) << "a worker that sends text for an embedding is broken";
}

// A language model that embeds only (no output head) is refused a generation at once, loaded or
// not: no worker hears of it. What its registration says is taken, and so is what a load says (a
// plugin's is known only then).
TEST_F(CoreEmbedTest, AModelThatEmbedsOnlyIsRefusedAGenerationWithoutAnyWorker) {
  ModelEntry embedder = LanguageModel("embedder");
  embedder.embeds_only = true;
  ModelEntry plugin = LanguageModel("plugin");
  ModelEntry plugin_as_read = plugin;
  plugin_as_read.embeds_only = true;
  CoreRig rig{CoreRig::SmallConfig()};
  rig.Start({embedder, plugin});
  rig.Up(0);
  rig.Loaded(0, plugin_as_read, 100);
  rig.Forget();
  Generate(rig, 5, "embedder");
  Generate(rig, 5, "plugin");
  std::vector<v1::Envelope> replies = rig.Replies(5);
  ASSERT_EQ(replies.size(), 2u);
  for (const v1::Envelope& reply : replies) {
    EXPECT_EQ(reply.error().code(), v1::FAILED_PRECONDITION) << reply.DebugString();
    EXPECT_NE(reply.error().message().find("embeds only"), std::string::npos) << reply.error().message();
  }
  EXPECT_TRUE(rig.Sent(0).empty()) << "nothing loaded, nothing run";
  SendEmbed(rig, 5, "plugin", {"x"});
  EXPECT_EQ(rig.Sent(0).size(), 1u) << "an embedding it serves";
}

}  // namespace
}  // namespace warmpool::supervisor::testing
