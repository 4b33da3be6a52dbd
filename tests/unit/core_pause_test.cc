// The supervisor paused (SIGSTOP, a VM stall): when it resumes, libuv runs the overdue tick before
// it polls for I/O, so the tick can come before a reply the worker wrote in time. The tick says
// how far the shell had read (event::Tick), and the core judges no worker or request on what it
// has not read: the late tick defers, the reply is read and answered, and no one is killed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/unit/core_rig.h"

namespace warmpool::supervisor {
namespace {

using testing::CoreRig;
using testing::Entry;

constexpr uint64_t kUnixBaseNs = 1'700'000'000'000'000'000ull;  // CoreRig's unix clock at 0
constexpr uint64_t kRigStartMs = 1000;  // CoreRig's clock, which only Advance moves (not used here)

Time At(uint64_t ms) { return Time{ms, kUnixBaseNs + ms * 1000000}; }

size_t Kills(const std::vector<Action>& actions) {
  size_t n = 0;
  for (const Action& a : actions) n += std::holds_alternative<action::KillWorker>(a);
  return n;
}

std::vector<v1::Envelope> RepliesIn(const std::vector<Action>& actions) {
  std::vector<v1::Envelope> out;
  for (const Action& a : actions) {
    if (auto* r = std::get_if<action::Reply>(&a)) out.push_back(r->envelope);
  }
  return out;
}

struct Paused {
  CoreRig rig{CoreRig::SmallConfig()};
  uint64_t job = 0;
  uint64_t request = 0;
  uint64_t before_ms = 0;  // the last time the shell read anything before the pause
};

// m serving on worker 0, a request with a 200 ms deadline running there; then the daemon stops.
void RunningWhenPaused(Paused& p) {
  ModelEntry m = Entry("m", 100, 10);
  p.rig.Start({m});
  p.rig.Up(0);
  p.rig.Up(1);
  p.rig.Loaded(0, m, 100);
  p.rig.Forget();
  v1::Envelope e;
  e.mutable_infer()->set_model("m");
  e.mutable_infer()->mutable_input()->set_rows(1);
  e.mutable_infer()->mutable_input()->set_cols(4);
  e.mutable_infer()->mutable_input()->set_data(std::string(16, '\0'));
  e.mutable_infer()->set_deadline_ms(200);
  p.request = p.rig.Request(7, std::move(e));
  std::vector<v1::WorkerEnvelope> sent = p.rig.Sent(0);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_TRUE(sent[0].has_infer());
  p.job = sent[0].infer().job();
  p.before_ms = kRigStartMs;
}

// The worker answers 10 ms later, well within the deadline, and the daemon is stopped for 5 s
// before it reads the answer. The overdue tick comes first and says the reading stopped before
// the pause: it kills no one and answers nothing. The answer read after it is the request's.
TEST(CorePauseTest, ALateTickJudgesNoOneOnWhatWasNotRead) {
  Paused p;
  RunningWhenPaused(p);
  const uint64_t resumed = p.before_ms + 5000;
  event::Tick late;
  late.workers_read_ms = p.before_ms;
  late.clients_read_ms = p.before_ms;
  std::vector<Action> actions = p.rig.core().Handle(late, At(resumed));
  EXPECT_EQ(Kills(actions), 0u) << "a worker whose answer waits unread was judged hung";
  EXPECT_TRUE(RepliesIn(actions).empty()) << "the request was answered before its answer was read";

  actions = p.rig.core().Handle(event::WorkerMessage{0, CoreRig::InferDone(p.job), {}}, At(resumed));
  std::vector<v1::Envelope> replies = RepliesIn(actions);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].request_id(), p.request);
  EXPECT_FALSE(replies[0].has_error()) << replies[0].error().message();

  // The next tick has read everything: nothing left to judge.
  actions = p.rig.core().Handle(event::Tick{}, At(resumed + kTickMs));
  EXPECT_EQ(Kills(actions), 0u);
  EXPECT_TRUE(p.rig.core().CheckInvariants().ok());
}

// The same tick, claiming everything was read (as the shell did before it read worker channels
// first): the worker is killed and the request fails, though its answer was on its way. This is
// what the shell's reading and the tick's account of it prevent.
TEST(CorePauseTest, ATickThatClaimsEverythingReadJudgesAtOnce) {
  Paused p;
  RunningWhenPaused(p);
  std::vector<Action> actions = p.rig.core().Handle(event::Tick{}, At(p.before_ms + 5000));
  EXPECT_EQ(Kills(actions), 1u);
  std::vector<v1::Envelope> replies = RepliesIn(actions);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].error().code(), v1::DEADLINE_EXCEEDED);
}

// A request that waited for its model through the pause is sent to the worker already past its
// deadline (the load's answer was read after the pause). It is answered DEADLINE_EXCEEDED, but
// its worker gets its grace from when it got the job: it is not killed on the next tick.
TEST(CorePauseTest, TheGraceRunsFromWhenTheWorkerGotTheJob) {
  Config config = CoreRig::SmallConfig();
  config.inference_grace_ms = 1000;
  CoreRig rig(config);
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  v1::Envelope e;
  e.mutable_infer()->set_model("m");
  e.mutable_infer()->mutable_input()->set_rows(1);
  e.mutable_infer()->mutable_input()->set_cols(4);
  e.mutable_infer()->mutable_input()->set_data(std::string(16, '\0'));
  e.mutable_infer()->set_deadline_ms(200);
  rig.Request(7, std::move(e));
  uint64_t load = 0;
  uint32_t loader = 0;
  for (uint32_t slot : {0u, 1u}) {
    for (const v1::WorkerEnvelope& w : rig.Sent(slot)) {
      if (w.has_load()) load = w.load().job(), loader = slot;
    }
  }
  ASSERT_NE(load, 0u);
  const uint64_t resumed = kRigStartMs + 5000;
  // Drained before the tick: the load is done and the request goes to the worker at once.
  std::vector<Action> actions =
      rig.core().Handle(event::WorkerMessage{loader, CoreRig::LoadDone(load, m), {100}}, At(resumed));
  actions = rig.core().Handle(event::Tick{}, At(resumed));
  ASSERT_EQ(RepliesIn(actions).size(), 1u);
  EXPECT_EQ(RepliesIn(actions)[0].error().code(), v1::DEADLINE_EXCEEDED);
  EXPECT_EQ(Kills(actions), 0u) << "killed before it had its grace";
  actions = rig.core().Handle(event::Tick{}, At(resumed + 500));
  EXPECT_EQ(Kills(actions), 0u);
  actions = rig.core().Handle(event::Tick{}, At(resumed + 1100));
  EXPECT_EQ(Kills(actions), 1u) << "a worker that never answers is still killed once its grace is over";
}

}  // namespace
}  // namespace warmpool::supervisor
