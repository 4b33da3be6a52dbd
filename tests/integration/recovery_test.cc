// Crash isolation (issue 3): workers that crash, hang or exit are detected, their requests are
// retried once or answered with a typed error, models that keep crashing become `failed` with a
// cooldown, and everything else keeps being served. Faults are injected through the admin protocol
// (`warmpool fault arm`), which the daemon accepts only with --enable-fault-injection. Timeouts are
// shortened through [recovery] and [daemon] so that each test takes a few seconds at most.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kFaults = {"--enable-fault-injection"};
// Respawn quickly so that tests do not wait on the production backoff.
const char* kFastRespawn = "[recovery]\nrespawn_min_ms = 20\nrespawn_max_ms = 200\n";

int64_t ElapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - since).count();
}

// Polls until done() holds or timeout_ms pass; returns whether it held.
bool WaitFor(const std::function<bool()>& done, int timeout_ms = 3000) {
  auto start = Clock::now();
  while (ElapsedMs(start) < timeout_ms) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

// The entry named `name` in a JSON array of objects (null when absent).
json Named(const json& list, const std::string& name) {
  if (!list.is_array()) return nullptr;
  for (const json& e : list) {
    if (e.value("name", "") == name) return e;
  }
  return nullptr;
}

class RecoveryTest : public DaemonTest {
 protected:
  // Runs the CLI, expects exit 0 and returns its stdout parsed as JSON.
  json CliJson(const std::vector<std::string>& args) {
    std::string out, err;
    int rc = Cli(args, &out, &err);
    EXPECT_EQ(rc, 0) << err;
    json doc = json::parse(out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(doc.is_discarded()) << out;
    return doc;
  }

  void Arm(const std::vector<std::string>& spec) {
    std::vector<std::string> args = {"fault", "arm"};
    args.insert(args.end(), spec.begin(), spec.end());
    std::string out, err;
    ASSERT_EQ(Cli(args, &out, &err), 0) << err;
    EXPECT_TRUE(Contains(out, "armed")) << out;
  }

  // `warmpool fault clear`: returns how many faults it reports as cleared (-1 on failure).
  int ClearFaults() {
    std::string out, err;
    int rc = Cli({"fault", "clear"}, &out, &err);
    EXPECT_EQ(rc, 0) << err;
    int n = -1;
    if (rc == 0 && std::sscanf(out.c_str(), "%d fault(s) cleared", &n) != 1) n = -1;
    EXPECT_GE(n, 0) << out;
    return n;
  }

  // Waits until no worker is starting or dead (respawns done); returns the last status.
  v1::StatusReply SettledStatus(client::Client& c) {
    v1::StatusReply last;
    WaitFor([&] {
      auto s = c.GetStatus();
      if (!s.ok()) return false;
      last = *s;
      for (const auto& w : s->workers()) {
        if (w.state() == "starting" || w.state() == "dead") return false;
      }
      return true;
    });
    WorkerPids();  // remember the respawned workers: TearDown checks that they are gone too
    return last;
  }

  static uint32_t TotalRestarts(const v1::StatusReply& s) {
    uint32_t n = 0;
    for (const auto& w : s.workers()) n += w.restarts();
    return n;
  }

  void ExpectInferCorrect(client::Client& c, const std::string& model, const std::string& path,
                          uint64_t seed = 7) {
    client::Matrix input = RandomMatrix(3, 8, seed);
    auto out = c.Infer(model, input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(ReferenceInfer(path, input), *out);
  }
};

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
