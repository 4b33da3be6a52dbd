// Crash isolation (issue 3): workers that crash, hang or exit are detected, their requests are
// retried once or answered with a typed error, models that keep crashing become `failed` with a
// cooldown, and everything else keeps being served. Faults are injected through the admin protocol
// (`warmpool fault arm`), which the daemon accepts only with --enable-fault-injection. Timeouts are
// shortened through [recovery] and [daemon] so that each test takes a few seconds at most. Crash
// loops and hangs are in recovery_loops_test.cc, the fixture in recovery_fixture.h.
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "tests/integration/recovery_fixture.h"

namespace warmpool::testing {
namespace {

// --- 1. The fault-injection admin requests ------------------------------------------------------

TEST_F(RecoveryTest, FaultCommandsAreRefusedWithoutTheFlag) {
  MakeModel("m", "8,4");
  StartDaemon();
  std::string out, err;
  EXPECT_EQ(Cli({"fault", "arm", "infer.mid", "kill"}, &out, &err), 1);
  EXPECT_TRUE(Contains(err, "error: FAILED_PRECONDITION: ")) << err;
  EXPECT_TRUE(Contains(err, "--enable-fault-injection")) << err;
  EXPECT_EQ(Cli({"fault", "clear"}, &out, &err), 1);
  EXPECT_TRUE(Contains(err, "error: FAILED_PRECONDITION: ")) << err;
  EXPECT_TRUE(Contains(err, "--enable-fault-injection")) << err;
  json status = CliJson({"status", "--json"});
  EXPECT_EQ(status["fault_injection"], false);
  // Refused means not armed: the model serves.
  auto c = Connect();
  EXPECT_TRUE(c->Infer("m", RandomMatrix(1, 8, 1)).ok());
}

TEST_F(RecoveryTest, FaultArmValidatesAndClearReportsTheCount) {
  MakeModel("m", "8,4");
  StartDaemon("", kFaults);
  std::string out, err;
  EXPECT_EQ(Cli({"fault", "arm", "infer.nowhere", "kill"}, &out, &err), 2);
  EXPECT_TRUE(Contains(err, "error: INVALID_ARGUMENT: unknown fault point \"infer.nowhere\""))
      << err;
  EXPECT_TRUE(Contains(err, "infer.mid")) << "the known points are listed: " << err;
  EXPECT_EQ(Cli({"fault", "arm", "infer.mid", "explode"}, &out, &err), 2);
  EXPECT_TRUE(Contains(err, "error: INVALID_ARGUMENT: unknown fault action \"explode\"")) << err;
  EXPECT_EQ(Cli({"fault", "arm", "infer.mid", "exit:256"}, &out, &err), 2);
  EXPECT_TRUE(Contains(err, "INVALID_ARGUMENT")) << err;
  EXPECT_EQ(Cli({"fault", "arm", "infer.mid", "delay:x"}, &out, &err), 2);
  EXPECT_TRUE(Contains(err, "INVALID_ARGUMENT")) << err;
  EXPECT_EQ(Cli({"fault", "arm", "infer.mid", "kill", "--model", "nope"}, &out, &err), 1);
  EXPECT_TRUE(Contains(err, "error: NOT_FOUND: model \"nope\" is not registered")) << err;

  EXPECT_EQ(ClearFaults(), 0) << "refused arms must not have armed anything";
  // Armed faults that never fire (the model is never used) are all cleared.
  Arm({"infer.mid", "kill", "--model", "m"});
  Arm({"load.begin", "exit:3", "--after", "5"});
  Arm({"unload.mid", "delay:10", "--times", "4"});
  EXPECT_EQ(ClearFaults(), 3);
  EXPECT_EQ(ClearFaults(), 0);
  json status = CliJson({"status", "--json"});
  EXPECT_EQ(status["fault_injection"], true);
  auto c = Connect();
  EXPECT_TRUE(c->Infer("m", RandomMatrix(1, 8, 1)).ok()) << "cleared faults do not fire";
  SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(SettledStatus(*c)), 0u);
}

// --- 2-3. Requests whose worker dies ------------------------------------------------------------

TEST_F(RecoveryTest, KilledMidInferenceIsRetriedOnceAndSucceeds) {
  std::string path = MakeModel("m", "8,16,4");
  StartDaemon(kFastRespawn, kFaults);
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  Arm({"infer.mid", "kill", "--model", "m"});  // --times 1 by default
  ExpectInferCorrect(*c, "m", path);
  EXPECT_EQ(ClearFaults(), 0) << "a fault armed for one shot is disarmed once it fired";

  v1::StatusReply s = SettledStatus(*c);
  int restarted = 0;
  for (const auto& w : s.workers()) {
    if (w.restarts() == 0) continue;
    restarted++;
    EXPECT_EQ(w.restarts(), 1u);
    EXPECT_TRUE(Contains(w.last_exit(), "killed by signal 9")) << w.last_exit();
  }
  EXPECT_EQ(restarted, 1) << s.DebugString();
  EXPECT_EQ(s.failed_size(), 0) << "one crash is not a crash loop";
  ExpectInferCorrect(*c, "m", path, 8);
}

TEST_F(RecoveryTest, RequestThatKillsTwoWorkersFailsInternal) {
  std::string path = MakeModel("m", "8,16,4");
  std::string other = MakeModel("other", "8,4", "relu", "f32", 2);
  StartDaemon(kFastRespawn, kFaults);
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  Arm({"infer.after_take", "kill", "--model", "m", "--times", "2"});
  auto out = c->Infer("m", RandomMatrix(3, 8, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kInternal) << out.status().ToString();
  EXPECT_TRUE(Contains(out.status().message(), "running when its worker died 2 times")) << out.status().message();
  EXPECT_TRUE(Contains(out.status().message(), "killed by signal 9")) << out.status().message();
  EXPECT_EQ(ClearFaults(), 0) << "both shots fired";

  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 2u) << s.DebugString();
  EXPECT_EQ(s.failed_size(), 0) << "two crashes are under the default crash-loop threshold";
  // The model reloads and serves again, and so does everyone else.
  ExpectInferCorrect(*c, "m", path);
  ExpectInferCorrect(*c, "other", other);
}

// --- 7. Load failures ---------------------------------------------------------------------------

void ExpectFailedEverywhere(json models, json ps, json status,
                            const std::string& reason) {
  json m = Named(models, "m");
  ASSERT_TRUE(m.is_object()) << models.dump(2);
  EXPECT_EQ(m["state"], "failed");
  ASSERT_TRUE(m["error"].is_string()) << m.dump();
  EXPECT_TRUE(Contains(m["error"].get<std::string>(), reason)) << m.dump();
  EXPECT_GT(m["retry_in_ms"].get<int64_t>(), 0) << m.dump();
  json p = Named(ps, "m");
  ASSERT_TRUE(p.is_object()) << "failed models are listed by ps: " << ps.dump(2);
  EXPECT_EQ(p["state"], "failed");
  ASSERT_TRUE(p["error"].is_string()) << p.dump();
  EXPECT_TRUE(Contains(p["error"].get<std::string>(), reason)) << p.dump();
  EXPECT_GT(p["retry_in_ms"].get<int64_t>(), 0) << p.dump();
  json f = Named(status["failed"], "m");
  ASSERT_TRUE(f.is_object()) << status.dump(2);
  EXPECT_TRUE(Contains(f["error"].get<std::string>(), reason)) << f.dump();
  EXPECT_GT(f["retry_in_ms"].get<int64_t>(), 0) << f.dump();
}

TEST_F(RecoveryTest, MalformedModelFileFailsWithTheReasonEverywhere) {
  std::string good = MakeModel("good", "8,4");
  { std::ofstream(models_dir_ + "/m.safetensors") << "this is not a model"; }
  StartDaemon("[recovery]\nfailed_cooldown_ms = 5000\n");
  auto c = Connect();
  std::vector<pid_t> before = WorkerPids();
  auto out = c->Infer("m", RandomMatrix(1, 8, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition) << out.status().ToString();
  EXPECT_TRUE(Contains(out.status().message(), "model \"m\" failed: ")) << out.status().message();
  // A broken file is not "retried": the message says to fix it and what reads it again.
  EXPECT_TRUE(Contains(out.status().message(), "its file is broken")) << out.status().message();
  EXPECT_TRUE(Contains(out.status().message(), "then run 'warmpool load m'")) << out.status().message();
  EXPECT_FALSE(Contains(out.status().message(), "retried in")) << out.status().message();
  std::string table, err;
  ASSERT_EQ(Cli({"ps"}, &table, &err), 0) << err;
  EXPECT_TRUE(Contains(table, "REASON")) << table;
  EXPECT_TRUE(Contains(table, "fix the file, then 'warmpool load m'")) << table;
  EXPECT_EQ(Named(CliJson({"ps", "--json"}), "m")["file_broken"], true);
  auto load = c->Load("m");
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.status().code(), Code::kFailedPrecondition) << load.status().ToString();

  ExpectFailedEverywhere(CliJson({"models", "--json"}), CliJson({"ps", "--json"}),
                         CliJson({"status", "--json"}), "m.safetensors");
  EXPECT_TRUE(Contains(DaemonLog(), "model \"m\" failed")) << DaemonLog();
  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 0u) << "a bad file is not a worker crash";
  EXPECT_EQ(WorkerPids(), before);
  ExpectInferCorrect(*c, "good", good);
}

TEST_F(RecoveryTest, ModelFileBrokenAfterRegistrationFailsInTheWorkerLoad) {
  std::string good = MakeModel("good", "8,4");
  std::string path = MakeModel("m", "8,64,4");
  StartDaemon("[recovery]\nfailed_cooldown_ms = 5000\n");
  // Registered with a valid header; then the data goes missing under the daemon.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 512);
  auto c = Connect();
  std::vector<pid_t> before = WorkerPids();
  auto load = c->Load("m");
  ASSERT_FALSE(load.ok());
  EXPECT_EQ(load.status().code(), Code::kFailedPrecondition) << load.status().ToString();
  EXPECT_TRUE(Contains(load.status().message(), "model \"m\" failed: ")) << load.status().message();
  EXPECT_TRUE(Contains(load.status().message(), "its file is broken")) << load.status().message();
  EXPECT_FALSE(Contains(load.status().message(), "retried in")) << load.status().message();
  auto out = c->Infer("m", RandomMatrix(1, 8, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kFailedPrecondition) << out.status().ToString();

  ExpectFailedEverywhere(CliJson({"models", "--json"}), CliJson({"ps", "--json"}),
                         CliJson({"status", "--json"}), "truncated");
  EXPECT_TRUE(Contains(DaemonLog(), "loading \"m\" failed")) << DaemonLog();
  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 0u) << "a failed load is not a worker crash";
  EXPECT_EQ(WorkerPids(), before);
  EXPECT_EQ(s.devices(0).used_bytes(), 0u) << "nothing stays accounted for the failed load";
  ExpectInferCorrect(*c, "good", good);
}

// --- 8. Exit status 2 ---------------------------------------------------------------------------

TEST_F(RecoveryTest, WorkerExitingWithStatus2IsNotRespawned) {
  std::string path = MakeModel("m", "8,16,4");
  std::string other = MakeModel("other", "8,4", "relu", "f32", 2);
  StartDaemon(kFastRespawn, kFaults);
  auto c = Connect();
  Arm({"load.begin", "exit:2", "--model", "m"});
  auto load = c->Load("m");  // the worker that took the load exits; the load runs on the other
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_EQ(ClearFaults(), 0);
  std::this_thread::sleep_for(milliseconds(300));  // many respawn periods

  auto s = c->GetStatus();
  ASSERT_TRUE(s.ok());
  int fatal = 0;
  for (const auto& w : s->workers()) {
    if (w.state() != "fatal") {
      EXPECT_EQ(w.restarts(), 0u);
      continue;
    }
    fatal++;
    EXPECT_EQ(w.restarts(), 0u) << "not respawned";
    EXPECT_TRUE(Contains(w.last_exit(), "exited with status 2")) << w.last_exit();
    EXPECT_TRUE(kill(w.pid(), 0) != 0 && errno == ESRCH) << "pid " << w.pid() << " still there";
  }
  EXPECT_EQ(fatal, 1) << s->DebugString();
  EXPECT_TRUE(Contains(DaemonLog(), "fatal configuration")) << DaemonLog();
  ExpectInferCorrect(*c, "m", path);
  ExpectInferCorrect(*c, "other", other);
}

// --- 9. Queued requests survive ------------------------------------------------------------------

TEST_F(RecoveryTest, RequestsQueuedOnAKilledWorkerAreNotLost) {
  std::string path = MakeModel("m", "64,256,64");
  StartDaemon(kFastRespawn, kFaults);
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  // The first request holds the worker long enough for the other 19 to queue behind it.
  Arm({"infer.after_take", "delay:400", "--model", "m"});
  std::vector<client::Matrix> inputs;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 20; i++) {
    inputs.push_back(RandomMatrix(4, 64, 100 + i));
    auto id = c->SendInfer("m", inputs.back());
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids.push_back(*id);
  }
  // The worker serving "m" is the busy one.
  auto watcher = Connect();
  pid_t victim = 0;
  uint32_t victim_slot = 0;
  ASSERT_TRUE(WaitFor([&] {
    auto s = watcher->GetStatus();
    if (!s.ok()) return false;
    for (const auto& w : s->workers()) {
      if (w.state() == "busy") {
        victim = w.pid();
        victim_slot = w.slot();
      }
    }
    return victim != 0;
  }, 1000));
  WorkerPids();
  std::this_thread::sleep_for(milliseconds(100));  // inside the delay
  ASSERT_EQ(kill(victim, SIGKILL), 0);

  for (size_t i = 0; i < ids.size(); i++) {
    auto reply = c->Wait(ids[i]);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_TRUE(reply->has_infer_reply()) << "request " << i << ": " << reply->DebugString();
    ExpectNear(ReferenceInfer(path, inputs[i]), *client::FromTensor(reply->infer_reply().output()));
  }
  v1::StatusReply s = SettledStatus(*watcher);
  EXPECT_EQ(s.workers(victim_slot).restarts(), 1u);
  EXPECT_TRUE(Contains(s.workers(victim_slot).last_exit(), "killed by signal 9"));
  EXPECT_EQ(TotalRestarts(s), 1u) << s.DebugString();
  EXPECT_EQ(s.failed_size(), 0);
  EXPECT_EQ(ClearFaults(), 0);
}

TEST_F(RecoveryTest, OneShotKillWithRequestsPipelinedFiresOnce) {
  // The worker dies with requests still unread in its channel. What it wrote before dying (the
  // fault report) must still be read: the one-shot fault fires once, every request succeeds.
  std::string path = MakeModel("m", "64,256,64");
  StartDaemon(kFastRespawn, kFaults);
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  Arm({"infer.mid", "kill", "--model", "m"});
  std::vector<client::Matrix> inputs;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 20; i++) {
    inputs.push_back(RandomMatrix(4, 64, 200 + i));
    auto id = c->SendInfer("m", inputs.back());
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (size_t i = 0; i < ids.size(); i++) {
    auto reply = c->Wait(ids[i]);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    ASSERT_TRUE(reply->has_infer_reply()) << "request " << i << ": " << reply->DebugString();
    ExpectNear(ReferenceInfer(path, inputs[i]), *client::FromTensor(reply->infer_reply().output()));
  }
  EXPECT_EQ(ClearFaults(), 0);
  v1::StatusReply s = SettledStatus(*c);
  EXPECT_EQ(TotalRestarts(s), 1u) << s.DebugString() << DaemonLog();
}

TEST_F(RecoveryTest, UnloadWaitingForARequestWhoseWorkerDiesLeavesTheModelServable) {
  std::string path = MakeModel("m", "8,4");
  StartDaemon("", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:500", "--model", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.before_restore", "kill", "--model", "m"}), 0);
  auto c = Connect();
  client::Matrix input = RandomMatrix(2, 8, 6);
  auto id = SendInfer(*c, "m", input, /*deadline_ms=*/10000);
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  // The unload waits for the request; the worker dies first and ends the unload itself.
  std::string out, err;
  EXPECT_EQ(Cli({"unload", "m"}, &out, &err), 0) << err;
  // The request is retried (the model loads again for it) and answered, not left to its deadline.
  ExpectInferReply(c->Wait(*id), ReferenceInfer(path, input));
  auto again = c->Infer("m", input, client::InferOptions{/*deadline_ms=*/5000, std::nullopt});
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

}  // namespace
}  // namespace warmpool::testing
