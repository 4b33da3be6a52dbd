// Typed tensors in the core (InferRequest.inputs): sent alone with the reply's bound, answered once
// with the worker's outputs, run again on another replica when its worker dies (the inputs kept);
// judged by their steps as embeddings are; a request that would not fit its worker's frame (one
// parsed from JSON can outgrow the body it came in) refused before any worker.
#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

uint64_t SendTyped(CoreRig& rig, uint64_t session, const std::string& model, uint64_t bytes = 8) {
  v1::Envelope e;
  e.mutable_infer()->set_model(model);
  v1::NamedTensor* ids = e.mutable_infer()->add_inputs();
  ids->set_name("input_ids");
  ids->set_dtype(v1::DTYPE_I64);
  ids->add_shape(static_cast<int64_t>(bytes / 8));
  ids->set_data(std::string(bytes, '\1'));
  return rig.Request(session, std::move(e), /*admin=*/false);
}

v1::WorkerEnvelope TypedDone(uint64_t job) {
  v1::WorkerEnvelope m;
  m.mutable_infer_done()->set_job(job);
  v1::NamedTensor* logits = m.mutable_infer_done()->add_outputs();
  logits->set_name("logits");
  logits->set_dtype(v1::DTYPE_F32);
  logits->add_shape(2);
  logits->set_data(std::string(8, '\0'));
  return m;
}

class CoreTypedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rig_.Start({lm_});
    rig_.Up(0);
    rig_.Up(1);
    rig_.Loaded(0, lm_, 100);
    rig_.Forget();
  }
  CoreRig rig_{CoreRig::SmallConfig()};
  ModelEntry lm_ = LanguageModel("lm");
};

TEST_F(CoreTypedTest, TypedTensorsRunAloneBoundedByAFrameAndAreAnsweredOnceWithTheOutputs) {
  const uint64_t request = SendTyped(rig_, 5, "lm");
  std::vector<v1::WorkerEnvelope> sent = rig_.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(sent[0].infer().inputs_size(), 1) << sent[0].DebugString();
  EXPECT_FALSE(sent[0].infer().batch());
  EXPECT_GT(sent[0].infer().max_output_bytes(), 0u);
  EXPECT_LE(sent[0].infer().max_output_bytes(), CoreRig::SmallConfig().max_frame_bytes);
  const uint64_t job = sent[0].infer().job();
  rig_.Reply(0, TypedDone(job));
  rig_.Reply(0, TypedDone(job));
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].request_id(), request);
  ASSERT_EQ(replies[0].infer_reply().outputs_size(), 1) << replies[0].DebugString();
  EXPECT_EQ(replies[0].infer_reply().outputs(0).name(), "logits");
  EXPECT_FALSE(replies[0].infer_reply().has_output());
}

TEST_F(CoreTypedTest, AWorkerThatDiesBeforeAnsweringHasTheInputsRunAgainOnAnotherReplica) {
  rig_.Load(1, "lm", /*replicas=*/2);
  std::vector<v1::WorkerEnvelope> attach = rig_.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  rig_.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), lm_));
  rig_.Forget();
  SendTyped(rig_, 5, "lm", 16);
  std::vector<v1::WorkerEnvelope> first = rig_.Sent(0);
  std::vector<v1::WorkerEnvelope> second = rig_.Sent(1);
  const uint32_t slot = first.empty() ? 1 : 0;
  const uint64_t job = (first.empty() ? second : first).at(0).infer().job();
  rig_.Down(slot, {job});
  EXPECT_TRUE(rig_.Replies(5).empty()) << "it runs again";
  uint64_t retried = 0;
  for (const v1::WorkerEnvelope& m : rig_.Sent(1 - slot)) {
    if (m.has_infer() && m.infer().inputs_size() == 1) {
      EXPECT_EQ(m.infer().inputs(0).data(), std::string(16, '\1')) << "the inputs the job kept";
      retried = m.infer().job();
    }
  }
  ASSERT_NE(retried, 0u);
  rig_.Reply(1 - slot, TypedDone(retried));
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].infer_reply().outputs_size(), 1);
}

TEST_F(CoreTypedTest, ARunIsJudgedByItsStepsAndCancelledWhenItsClientLeaves) {
  SendTyped(rig_, 5, "lm");
  const uint64_t job = rig_.Sent(0).at(0).infer().job();
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
  EXPECT_EQ(sent[0].cancel().job(), job);
  rig_.Advance(CoreRig::SmallConfig().load_stall_ms);
  ASSERT_EQ(rig_.Count<action::KillWorker>(), 1u) << "silent past the stall time";
  EXPECT_NE(rig_.Of<action::KillWorker>()[0].reason.find("running tensors"), std::string::npos);
}

TEST_F(CoreTypedTest, ARequestLargerThanItsWorkersFrameIsRefusedBeforeAnyWorker) {
  SendTyped(rig_, 5, "lm", CoreRig::SmallConfig().max_frame_bytes + 8);
  std::vector<v1::Envelope> replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::INVALID_ARGUMENT) << replies[0].DebugString();
  EXPECT_NE(replies[0].error().message().find("max_frame_bytes"), std::string::npos);
  EXPECT_TRUE(rig_.Sent(0).empty());
  EXPECT_TRUE(rig_.Sent(1).empty());
  // A matrix to a language model is refused; typed tensors are its door.
  v1::Envelope matrix;
  matrix.mutable_infer()->set_model("lm");
  matrix.mutable_infer()->mutable_input()->set_rows(1);
  matrix.mutable_infer()->mutable_input()->set_cols(1);
  matrix.mutable_infer()->mutable_input()->set_data(std::string(4, '\0'));
  rig_.Request(5, std::move(matrix), false);
  replies = rig_.Replies(5);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::FAILED_PRECONDITION);
}

}  // namespace
}  // namespace warmpool::supervisor::testing
