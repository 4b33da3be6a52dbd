// Crash isolation, continued: models that keep crashing become `failed` with a cooldown, and hung
// inferences and stalled loads are killed after their bounds, while queued loads and unloads are not
// taken for stalls (the fixture: recovery_fixture.h).
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/integration/recovery_fixture.h"

namespace warmpool::testing {
namespace {

// --- 4. Crash loops -----------------------------------------------------------------------------

// Sends requests one at a time while every worker that runs "m" dies, until the model is failed.
// Returns the FAILED_PRECONDITION status that ended it.
Status DriveIntoCrashLoop(client::Client& c, int* internal_replies) {
  *internal_replies = 0;
  for (int i = 0; i < 10; i++) {
    auto out = c.Infer("m", RandomMatrix(1, 8, i));
    EXPECT_FALSE(out.ok()) << "request " << i << " succeeded while every run crashes";
    if (out.ok()) continue;
    if (out.status().code() == Code::kFailedPrecondition) return out.status();
    EXPECT_EQ(out.status().code(), Code::kInternal) << out.status().ToString();
    (*internal_replies)++;
  }
  return Error(Code::kInternal, "test: the model never became failed");
}

void ExpectFailedForCrashes(const Status& s) {
  EXPECT_EQ(s.code(), Code::kFailedPrecondition) << s.ToString();
  EXPECT_TRUE(Contains(s.message(), "model \"m\" failed")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "crashed its worker 3 times")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "it will be retried in")) << s.message();
  EXPECT_TRUE(Contains(s.message(), "warmpool load m")) << s.message();
}

TEST_F(RecoveryTest, CrashLoopMakesTheModelFailedAndAnExplicitLoadRetriesAtOnce) {
  std::string path = MakeModel("m", "8,16,4");
  std::string other = MakeModel("other", "8,4", "relu", "f32", 2);
  // A cooldown long enough that "right away" below cannot race it (the explicit load skips it).
  StartDaemon(std::string(kFastRespawn) + "crash_loop_crashes = 3\nfailed_cooldown_ms = 5000\n",
              kFaults);
  auto c = Connect();
  Arm({"infer.mid", "kill", "--model", "m", "--times", "100"});
  int internal = 0;
  Status failed = DriveIntoCrashLoop(*c, &internal);
  ExpectFailedForCrashes(failed);
  // Each request costs up to two crashes: the third crash comes with the second request.
  EXPECT_EQ(internal, 1);

  json ps = CliJson({"ps", "--json"});
  json entry = Named(ps, "m");
  ASSERT_TRUE(entry.is_object()) << ps.dump(2);
  EXPECT_EQ(entry["state"], "failed");
  ASSERT_TRUE(entry["error"].is_string()) << entry.dump();
  EXPECT_TRUE(Contains(entry["error"].get<std::string>(), "crashed its worker")) << entry.dump();
  EXPECT_GT(entry["retry_in_ms"].get<int64_t>(), 0);
  EXPECT_LE(entry["retry_in_ms"].get<int64_t>(), 5000);
  json status = CliJson({"status", "--json"});
  json listed = Named(status["failed"], "m");
  ASSERT_TRUE(listed.is_object()) << status.dump(2);
  EXPECT_TRUE(Contains(listed["error"].get<std::string>(), "crashed its worker")) << listed.dump();
  EXPECT_GT(listed["retry_in_ms"].get<int64_t>(), 0);
  json models = CliJson({"models", "--json"});
  EXPECT_EQ(Named(models, "m")["state"], "failed");

  EXPECT_EQ(ClearFaults(), 1);
  // Cooling down: refused at once, with why and when, without touching a worker.
  auto refused = c->Infer("m", RandomMatrix(1, 8, 1));
  ASSERT_FALSE(refused.ok());
  ExpectFailedForCrashes(refused.status());
  // Other models were never affected.
  ExpectInferCorrect(*c, "other", other);

  // An explicit load retries at once.
  auto started = Clock::now();
  std::string out, err;
  EXPECT_EQ(Cli({"load", "m"}, &out, &err), 0) << err;
  EXPECT_TRUE(Contains(out, "m ready")) << out;
  EXPECT_LT(ElapsedMs(started), 2000) << "the load waited for the cooldown";
  ExpectInferCorrect(*c, "m", path);
  entry = Named(CliJson({"ps", "--json"}), "m");
  EXPECT_EQ(entry["state"], "ready") << entry.dump();
  EXPECT_EQ(entry["retry_in_ms"], 0);
  EXPECT_EQ(CliJson({"status", "--json"})["failed"].size(), 0u);
}

TEST_F(RecoveryTest, CrashLoopEndsAfterTheCooldown) {
  std::string path = MakeModel("m", "8,16,4");
  StartDaemon(std::string(kFastRespawn) + "crash_loop_crashes = 3\nfailed_cooldown_ms = 800\n",
              kFaults);
  auto c = Connect();
  Arm({"infer.mid", "kill", "--model", "m", "--times", "100"});
  int internal = 0;
  Status failed = DriveIntoCrashLoop(*c, &internal);
  ExpectFailedForCrashes(failed);
  EXPECT_EQ(ClearFaults(), 1);

  // retry_in_ms counts down to 0 within the cooldown.
  auto started = Clock::now();
  int64_t last = -1;
  bool cooled = WaitFor([&] {
    json entry = Named(CliJson({"ps", "--json"}), "m");
    if (!entry.is_object()) return false;
    EXPECT_EQ(entry["state"], "failed") << "nothing retries it before a request comes";
    last = entry["retry_in_ms"].get<int64_t>();
    return last == 0;
  }, 3000);
  ASSERT_TRUE(cooled) << "retry_in_ms still " << last;
  EXPECT_LT(ElapsedMs(started), 1500);
  // A plain request now loads it again.
  ExpectInferCorrect(*c, "m", path);
  json entry = Named(CliJson({"ps", "--json"}), "m");
  EXPECT_EQ(entry["state"], "ready") << entry.dump();
}

// --- 5-6. Hangs ---------------------------------------------------------------------------------

TEST_F(RecoveryTest, HungInferenceIsKilledAfterItsDeadlinePlusGrace) {
  std::string path = MakeModel("m", "8,16,4");
  // Continues the fixture's [daemon] table.
  StartDaemon("default_deadline_ms = 400\n" + std::string(kFastRespawn) + "inference_grace_ms = 200\n",
              kFaults);
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  Arm({"infer.mid", "hang", "--model", "m"});
  auto started = Clock::now();
  auto out = c->Infer("m", RandomMatrix(1, 8, 1));
  int64_t waited = ElapsedMs(started);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kDeadlineExceeded) << out.status().ToString();
  EXPECT_TRUE(Contains(out.status().message(), "did not finish before the deadline"))
      << out.status().message();
  EXPECT_GE(waited, 350);
  EXPECT_LT(waited, 1500) << "answered at the deadline, not when the worker is killed";

  // The worker is killed once the grace period is over too.
  bool killed = WaitFor([&] {
    auto s = c->GetStatus();
    return s.ok() && TotalRestarts(*s) == 1;
  });
  ASSERT_TRUE(killed) << DaemonLog();
  EXPECT_TRUE(Contains(DaemonLog(), "overran its deadline")) << DaemonLog();
  v1::StatusReply s = SettledStatus(*c);
  for (const auto& w : s.workers()) {
    if (w.restarts() == 1) {
      EXPECT_TRUE(Contains(w.last_exit(), "killed by signal 9")) << w.last_exit();
    }
  }
  EXPECT_EQ(ClearFaults(), 0);
  ExpectInferCorrect(*c, "m", path);
}

TEST_F(RecoveryTest, StalledLoadIsKilledAndRetriedOnAnotherWorker) {
  std::string path = MakeModel("m", "8,16,4");
  StartDaemon(std::string(kFastRespawn) + "load_stall_ms = 500\n", kFaults);
  auto c = Connect();
  Arm({"load.begin", "hang", "--model", "m"});
  auto started = Clock::now();
  std::string out, err;
  EXPECT_EQ(Cli({"load", "m"}, &out, &err), 0) << err;
  EXPECT_TRUE(Contains(out, "m ready")) << out;
  EXPECT_GE(ElapsedMs(started), 450) << "the first attempt stalled for load_stall_ms";
  EXPECT_TRUE(Contains(DaemonLog(), "loading of \"m\" made no progress")) << DaemonLog();
  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 1u) << s.DebugString();
  EXPECT_EQ(s.failed_size(), 0);
  EXPECT_EQ(ClearFaults(), 0);
  ExpectInferCorrect(*c, "m", path);
}

TEST_F(RecoveryTest, LoadQueuedBehindAnotherLoadIsNotAStall) {
  // Three loads on two workers: the third waits in worker 0 behind the first (a worker runs its
  // loads one at a time). Each load on its own is silent for 300 ms, under load_stall_ms; time
  // spent waiting behind another load is not a stall, and nobody may be killed for it.
  std::string p1 = MakeModel("m1", "8,16,4", "relu", "f32", 1);
  MakeModel("m2", "8,16,4", "relu", "f32", 2);
  std::string p3 = MakeModel("m3", "8,16,4", "relu", "f32", 3);
  StartDaemon(std::string(kFastRespawn) + "load_stall_ms = 450\n", kFaults);
  // m2 is slow too, so that m3 goes to worker 0 (tie on models and outstanding: lowest slot).
  for (const char* name : {"m1", "m2", "m3"}) Arm({"load.begin", "delay:300", "--model", name});
  auto c = Connect();
  std::vector<uint64_t> ids;
  for (const char* name : {"m1", "m2", "m3"}) {
    auto id = c->Send(client::LoadRequest(name));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (uint64_t id : ids) {
    auto reply = c->Wait(id);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_TRUE(reply->has_load_reply()) << reply->DebugString();
  }
  std::string log = DaemonLog();
  const std::regex on_worker0(R"(loading "m1" \([0-9.]+ KiB\) on worker 0[^]*loading "m3" \([0-9.]+ KiB\) on worker 0)");
  ASSERT_TRUE(std::regex_search(log, on_worker0))
      << "the scenario needs m1 and m3 on the same worker:\n" << log;
  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 0u) << "a worker was killed for a load that was only queued:\n"
                                  << DaemonLog();
  ExpectInferCorrect(*c, "m1", p1);
  ExpectInferCorrect(*c, "m3", p3);
}

TEST_F(RecoveryTest, UnloadQueuedBehindInferenceIsNotAStall) {
  // "a" and "c" share worker 0 ("b" takes worker 1). An unload of "c" sent while "a" runs a
  // 400 ms inference on that worker waits behind it; that wait is not an unload that stalls.
  std::string pa = MakeModel("a", "8,16,4", "relu", "f32", 1);
  MakeModel("b", "8,16,4", "relu", "f32", 2);
  MakeModel("c", "8,16,4", "relu", "f32", 3);
  StartDaemon(std::string(kFastRespawn) + "load_stall_ms = 300\n", kFaults);
  auto c = Connect();
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(c->Load(name).ok());
  Arm({"infer.mid", "delay:400", "--model", "a"});
  client::Matrix input = RandomMatrix(2, 8, 3);
  auto infer_id = c->SendInfer("a", input);
  ASSERT_TRUE(infer_id.ok());
  std::this_thread::sleep_for(milliseconds(50));
  auto unload_id = c->Send(client::UnloadRequest("c"));
  ASSERT_TRUE(unload_id.ok());
  auto r1 = c->Wait(*infer_id);
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(r1->has_infer_reply()) << r1->DebugString();
  ExpectNear(ReferenceInfer(pa, input), *client::FromTensor(r1->infer_reply().output()));
  auto r2 = c->Wait(*unload_id);
  ASSERT_TRUE(r2.ok());
  EXPECT_TRUE(r2->has_unload_reply()) << r2->DebugString();
  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 0u) << "a worker was killed for an unload that was only queued:\n"
                                  << DaemonLog();
}

}  // namespace
}  // namespace warmpool::testing
