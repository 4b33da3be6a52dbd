// After a worker dies: its requests are retried without making everyone else wait for them.
// Retries go to a worker one at a time, and new requests go before the retries waiting, into a
// short window; connections take turns among the retries; and the retries spread over every
// replica serving the model.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "tests/unit/core_rig.h"

namespace warmpool::supervisor {
namespace {

using testing::CoreRig;
using testing::Entry;

std::vector<v1::WorkerInfer> Infers(const std::vector<v1::WorkerEnvelope>& sent) {
  std::vector<v1::WorkerInfer> out;
  for (const v1::WorkerEnvelope& w : sent) {
    if (w.has_infer()) out.push_back(w.infer());
  }
  return out;
}

// Two workers up and model m loaded on worker 0; everything said so far forgotten.
void ServingOnWorker0(CoreRig& rig, const ModelEntry& m) {
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100);
  rig.Forget();
}

// m serving on worker 0 with three requests of session 7 on it; worker 0 dies running the first.
// The attach of the held weights sent to worker 1, not yet answered: its job id.
uint64_t DiesWithThreeRequests(CoreRig& rig, const ModelEntry& m) {
  ServingOnWorker0(rig, m);
  for (int i = 0; i < 3; ++i) rig.Infer(7, "m");
  std::vector<v1::WorkerInfer> on0 = Infers(rig.Sent(0));
  EXPECT_EQ(on0.size(), 3u);
  if (on0.empty()) return 0;
  rig.Down(0, {on0[0].job()});
  std::vector<v1::WorkerEnvelope> attach = rig.Sent(1);
  EXPECT_EQ(attach.size(), 1u);
  if (attach.empty() || !attach[0].has_attach()) return 0;
  return attach[0].attach().job();
}

// The model's replica dies with five requests on it (four of session 7, one of 8), running the
// first; the weights are attached to the other worker. The retries go there one at a time: first
// those that never ran at the crash, session 8's (its connection lost fewer) before session 7's,
// and the one that was running last, alone. A request that arrives meanwhile goes at once: it
// waits for at most the one retry running.
TEST(CoreRecoveryTest, RetriesGoOneAtATimeAndNewRequestsPassThem) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  ServingOnWorker0(rig, m);
  std::vector<uint64_t> of7;
  for (int i = 0; i < 4; ++i) of7.push_back(rig.Infer(7, "m"));
  uint64_t of8 = rig.Infer(8, "m");
  std::vector<v1::WorkerInfer> on0 = Infers(rig.Sent(0));
  ASSERT_EQ(on0.size(), 5u) << "all five in worker 0's window";

  rig.Down(0, {on0[0].job()});  // running the first, the rest queued behind it
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(1);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_attach()) << "the held weights go to the worker still up";
  rig.Reply(1, CoreRig::LoadDone(sent[0].attach().job(), m));
  std::vector<v1::WorkerInfer> retried = Infers(rig.Sent(1));
  ASSERT_EQ(retried.size(), 1u) << "one retry at a time per worker";
  EXPECT_TRUE(retried[0].batch()) << "one that never ran at the crash is innocent: it may batch";

  // A new request now goes straight to the worker, behind only the retry it is running.
  uint64_t of9 = rig.Infer(9, "m");
  std::vector<v1::WorkerInfer> fresh = Infers(rig.Sent(1));
  ASSERT_EQ(fresh.size(), 1u) << "a new request passes the retries waiting in the daemon";
  rig.Reply(1, CoreRig::InferDone(fresh[0].job()));
  std::vector<v1::Envelope> replies = rig.Replies(9);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].request_id(), of9);
  EXPECT_TRUE(replies[0].has_infer_reply());
  EXPECT_TRUE(rig.Sent(1).empty()) << "the next retry waits for the one running";

  // Each answer sends the next retry; session 8 first, the suspect last and alone.
  std::vector<uint64_t> order;
  for (int i = 0; i < 5; ++i) {
    ASSERT_EQ(retried.size(), 1u) << "retry " << i;
    if (i == 4) {
      EXPECT_FALSE(retried[0].batch()) << "the one that was running is a suspect: alone";
    }
    rig.Reply(1, CoreRig::InferDone(retried[0].job()));
    for (uint64_t session : {7u, 8u}) {
      for (const v1::Envelope& r : rig.Replies(session)) {
        EXPECT_TRUE(r.has_infer_reply()) << r.DebugString();
        order.push_back(r.request_id());
      }
    }
    retried = Infers(rig.Sent(1));
  }
  EXPECT_TRUE(retried.empty());
  EXPECT_EQ(order, (std::vector<uint64_t>{of8, of7[1], of7[2], of7[3], of7[0]}));
  EXPECT_EQ(rig.core().unanswered(), 0u);
}

// With two replicas, one dies with its window full: the retries spread over the survivor and, once
// it is back, the respawned worker's new replica, one at a time on each.
TEST(CoreRecoveryTest, RetriesSpreadOverTheModelsReplicas) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100, /*replicas=*/2);
  std::vector<v1::WorkerEnvelope> attach = rig.Sent(1);
  ASSERT_EQ(attach.size(), 1u);
  ASSERT_TRUE(attach[0].has_attach());
  rig.Reply(1, CoreRig::LoadDone(attach[0].attach().job(), m));
  rig.Replies(1);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(rig.Infer(7, "m"));
  std::vector<v1::WorkerInfer> on0 = Infers(rig.Sent(0));
  std::vector<v1::WorkerInfer> on1 = Infers(rig.Sent(1));
  ASSERT_EQ(on0.size(), 4u);
  ASSERT_EQ(on1.size(), 4u);

  rig.Down(0, {on0[0].job()});
  std::vector<v1::WorkerInfer> retried = Infers(rig.Sent(1));
  ASSERT_EQ(retried.size(), 1u) << "one retry behind worker 1's own work";
  // Worker 0 comes back: the model grows to its two replicas again, and the next retry goes there.
  rig.Advance(200);
  rig.Up(0);
  std::vector<v1::WorkerEnvelope> sent = rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_attach());
  rig.Reply(0, CoreRig::LoadDone(sent[0].attach().job(), m));
  std::vector<v1::WorkerInfer> on0_again = Infers(rig.Sent(0));
  ASSERT_EQ(on0_again.size(), 1u) << "a retry on the new replica at once";

  // Drain both, answering in turn; every request answered once, successfully.
  std::map<uint32_t, std::vector<v1::WorkerInfer>> running{{0, on0_again}, {1, on1}};
  running[1].push_back(retried[0]);
  size_t answered = 0;
  for (int round = 0; round < 20 && answered < 8; ++round) {
    for (uint32_t slot : {0u, 1u}) {
      if (running[slot].empty()) continue;
      rig.Reply(slot, CoreRig::InferDone(running[slot].front().job()));
      running[slot].erase(running[slot].begin());
      for (const v1::WorkerInfer& next : Infers(rig.Sent(slot))) running[slot].push_back(next);
      for (const v1::Envelope& r : rig.Replies(7)) {
        EXPECT_TRUE(r.has_infer_reply()) << r.DebugString();
        answered++;
      }
    }
  }
  EXPECT_EQ(answered, 8u);
  EXPECT_EQ(rig.core().unanswered(), 0u);
}

// A request sent while the dead worker's weights are being attached elsewhere waits for no retry:
// it goes to the worker before the first of them.
TEST(CoreRecoveryTest, ARequestSentDuringTheAttachGoesBeforeTheRetries) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  const uint64_t attach = DiesWithThreeRequests(rig, m);
  ASSERT_NE(attach, 0u);
  const uint64_t fresh = rig.Infer(9, "m");  // while the attach runs
  EXPECT_TRUE(Infers(rig.Sent(1)).empty()) << "nothing runs before the weights are attached";
  rig.Reply(1, CoreRig::LoadDone(attach, m));
  std::vector<v1::WorkerInfer> sent = Infers(rig.Sent(1));
  ASSERT_EQ(sent.size(), 2u) << "the new request, then one retry";
  rig.Reply(1, CoreRig::InferDone(sent[0].job()));
  std::vector<v1::Envelope> replies = rig.Replies(9);
  ASSERT_EQ(replies.size(), 1u) << "the first answer is the new request's";
  EXPECT_EQ(replies[0].request_id(), fresh);
  EXPECT_TRUE(rig.Replies(7).empty());
  // The retries then run one at a time, and all are answered.
  std::vector<v1::WorkerInfer> running = {sent[1]};
  size_t answered = 0;
  for (int i = 0; i < 5 && !running.empty(); ++i) {
    ASSERT_EQ(running.size(), 1u);
    rig.Reply(1, CoreRig::InferDone(running[0].job()));
    answered += rig.Replies(7).size();
    running = Infers(rig.Sent(1));
  }
  EXPECT_EQ(answered, 3u);
  EXPECT_EQ(rig.core().unanswered(), 0u);
}

// New requests pass the waiting retries only into a short window, so that each retry in turn
// waits behind a few of them, not behind a full window of them every time.
TEST(CoreRecoveryTest, NewRequestsPassRetriesOnlyIntoAShortWindow) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  const uint64_t attach = DiesWithThreeRequests(rig, m);
  ASSERT_NE(attach, 0u);
  rig.Reply(1, CoreRig::LoadDone(attach, m));
  std::vector<v1::WorkerInfer> first_retry = Infers(rig.Sent(1));
  ASSERT_EQ(first_retry.size(), 1u);
  for (int i = 0; i < 10; ++i) rig.Infer(9, "m");
  std::vector<v1::WorkerInfer> passed = Infers(rig.Sent(1));
  EXPECT_EQ(passed.size(), kPassingRetryJobs - 1) << "the retry and a few new ones in the window";
  // The retry ends: one new request fills the short window again, and the next retry goes behind
  // it, never behind more than the short window of new ones.
  rig.Reply(1, CoreRig::InferDone(first_retry[0].job()));
  std::vector<v1::WorkerInfer> next = Infers(rig.Sent(1));
  ASSERT_EQ(next.size(), 2u) << "one new request into the short window, then the next retry";
  EXPECT_EQ(rig.Replies(7).size(), 1u);
  rig.Reply(1, CoreRig::InferDone(passed[0].job()));
  EXPECT_EQ(Infers(rig.Sent(1)).size(), 0u) << "the short window is full again (three new, one retry)";
}

// A model whose request ran beside another model's load when the worker died may be innocent:
// three such crashes do not fail it (they would, alone), and its requests are served.
TEST(CoreRecoveryTest, CrashesBesideAnotherModelsLoadDoNotFailABystander) {
  Config config = CoreRig::SmallConfig();
  config.workers_per_device = 1;
  config.crash_loop_crashes = 3;
  config.respawn_max_ms = 100;
  CoreRig rig(config);
  ModelEntry b = Entry("bystander", 100, 10);
  ModelEntry n = Entry("n", 100, 10);
  rig.Start({b, n});
  rig.Up(0);
  rig.Loaded(0, b, 100);
  rig.Replies(1);
  for (int crash = 0; crash < 3; ++crash) {
    uint64_t id = rig.Infer(7, "bystander");
    std::vector<v1::WorkerInfer> running = Infers(rig.Sent(0));
    ASSERT_EQ(running.size(), 1u);
    rig.Load(1, "n");
    std::vector<v1::WorkerEnvelope> load = rig.Sent(0);
    ASSERT_EQ(load.size(), 1u);
    ASSERT_TRUE(load[0].has_load());
    rig.Down(0, {running[0].job(), load[0].load().job()});  // which one aborted? either
    rig.Advance(200);
    rig.Up(0);
    for (int round = 0; round < 3; ++round) {
      for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
        if (w.has_attach()) rig.Reply(0, CoreRig::LoadDone(w.attach().job(), b));
        if (w.has_load()) rig.Reply(0, CoreRig::LoadDone(w.load().job(), n), {200 + crash});
        if (w.has_infer()) rig.Reply(0, CoreRig::InferDone(w.infer().job()));
      }
    }
    std::vector<v1::Envelope> replies = rig.Replies(7);
    ASSERT_EQ(replies.size(), 1u) << "crash " << crash + 1;
    EXPECT_EQ(replies[0].request_id(), id);
    EXPECT_TRUE(replies[0].has_infer_reply()) << "crash " << crash + 1 << ": " << replies[0].DebugString();
    rig.Unload(1, "n");
    for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
      if (w.has_unload()) rig.Reply(0, CoreRig::UnloadDone(w.unload().job()));
    }
    rig.Replies(1);
  }
  EXPECT_NE(rig.State("bystander"), shm::ModelState::kFailed);
  EXPECT_NE(rig.State("n"), shm::ModelState::kFailed);
}

}  // namespace
}  // namespace warmpool::supervisor
