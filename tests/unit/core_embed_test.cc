// Embed requests in the core (supervisor/core/embed.cc): an inference whose answer is vectors.
// Sent alone (never batched) to a worker of a language model, answered once, run again on another
// replica when its worker dies before answering, refused before any worker for a dense model or an
// input the context cannot hold.
#include "tests/unit/core_rig.h"

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

}  // namespace
}  // namespace warmpool::supervisor::testing
