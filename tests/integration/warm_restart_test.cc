// Warm models across a restart of warmpoold (supervisor/warm_store.h): under a stand-in for
// systemd's descriptor store (launch/service_manager_double.h), the weights a daemon held survive
// its SIGKILL or its stop, and the next daemon serves them without reading a file: the files are
// deleted before it starts.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class WarmRestartTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    auto double_ = launch::ServiceManagerDouble::Open(dir_ + "/notify");
    ASSERT_TRUE(double_.ok()) << double_.status().ToString();
    service_manager_ = std::move(*double_);
  }

  // Models declared in the config (a deleted file leaves them registered, as failed), with room
  // to park.
  void Start(const std::vector<std::string>& models, const std::string& pool = "park_budget = \"64MiB\"\n") {
    std::string toml = "[pool]\n" + pool;
    for (const std::string& m : models) {
      toml += "[[models]]\nname = \"" + m + "\"\npath = \"" + models_dir_ + "/" + m + ".safetensors\"\n";
    }
    StartDaemon(toml);
  }

  std::map<std::string, std::string> States() {
    std::string out, err;
    Cli({"models", "--json"}, &out, &err);
    std::map<std::string, std::string> states;
    auto models = nlohmann::json::parse(out, nullptr, false);
    if (!models.is_array()) return states;
    for (const auto& m : models) states[m["name"].get<std::string>()] = m["state"].get<std::string>();
    return states;
  }

  // Until the store holds a manifest naming `handles` kept handles, and nothing else (the daemon
  // brings it up to date within kKeptSyncMs (supervisor/core/kept.h) of a change).
  bool WaitForStore(size_t handles) { return service_manager_->WaitForKept(handles, 4s); }

  std::string StoredNames() {
    std::string names;
    for (const auto& [name, count] : service_manager_->Stored()) names += name + " x" + std::to_string(count) + "\n";
    return names;
  }
};

TEST_F(WarmRestartTest, ASigkilledDaemonsWarmModelsAreServedByTheNextWithTheirFilesDeleted) {
  std::string a = MakeModel("a", "16,64,8", "relu", "f32", 1);
  std::string b = MakeModel("b", "16,32,4", "tanh", "f16", 2);
  MakeModel("c", "16,8", "relu", "f32", 3);
  Start({"a", "b", "c"});
  client::Matrix input = RandomMatrix(3, 16, 5);
  client::Matrix expect_a = ReferenceInfer(a, input), expect_b = ReferenceInfer(b, input);
  std::string out, err;
  ASSERT_EQ(Cli({"load", "b"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"unload", "--park", "b"}, &out, &err), 0) << err;
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Infer("a", input).ok());
  c.reset();
  ASSERT_TRUE(WaitForStore(2)) << StoredNames();
  // Each handle is named after its model and file version.
  std::string names = StoredNames();
  EXPECT_NE(names.find("wp.w.a."), std::string::npos) << names;
  EXPECT_NE(names.find("wp.p.b."), std::string::npos) << names;

  KillDaemon();
  fs::remove(a);
  fs::remove(b);
  Start({"a", "b", "c"});
  std::map<std::string, std::string> states = States();
  EXPECT_EQ(states["a"], "ready") << "ready at once";
  EXPECT_EQ(states["b"], "parked");
  EXPECT_EQ(states["c"], "registered");
  c = Connect();
  ASSERT_NE(c, nullptr);
  auto got = c->Infer("a", input);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(expect_a, *got);
  got = c->Infer("b", input);  // unparked from the kept copy
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(expect_b, *got, 1e-2f);
  c.reset();
  std::string log = DaemonLog();
  EXPECT_NE(log.find("adopted \"a\" ready"), std::string::npos) << log;
  EXPECT_NE(log.find("adopted \"b\" parked"), std::string::npos) << log;
  EXPECT_NE(log.find("2 kept warm across the restart"), std::string::npos) << log;
  // Both are on the device now: b's copy was let go, and the store follows.
  ASSERT_TRUE(WaitForStore(2)) << StoredNames();
  names = StoredNames();
  EXPECT_NE(names.find("wp.w.b."), std::string::npos) << names;
  EXPECT_EQ(names.find("wp.p.b."), std::string::npos) << names;
}

// SIGTERM, then a start with what the store holds: `systemctl restart` where systemd keeps the
// store through it (FileDescriptorStorePreserve=restart, systemd >= 254).
TEST_F(WarmRestartTest, ASigtermAndAStartWithTheStoreKeepThemToo) {
  std::string a = MakeModel("a", "16,64,8");
  Start({"a"});
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  ASSERT_TRUE(WaitForStore(1)) << StoredNames();
  ASSERT_EQ(StopDaemon(), 0) << DaemonLog();
  Start({"a"});
  EXPECT_EQ(States()["a"], "ready");
  auto c = Connect();
  client::Matrix input = RandomMatrix(2, 16, 9);
  auto got = c->Infer("a", input);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(ReferenceInfer(a, input), *got);
  EXPECT_EQ(DaemonLog().find("loading \"a\""), DaemonLog().rfind("loading \"a\"")) << "loaded once, in the first run";
}

TEST_F(WarmRestartTest, AFileChangedMeanwhileIsLoadedAgainAndWhatWasKeptIsLetGo) {
  std::string a = MakeModel("a", "16,64,8", "relu", "f32", 1);
  Start({"a"});
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  ASSERT_TRUE(WaitForStore(1)) << StoredNames();
  KillDaemon();
  MakeModel("a", "16,64,8", "relu", "f32", 7);  // another version, same shape
  Start({"a"});
  EXPECT_NE(DaemonLog().find("not adopting the weights kept of \"a\": its file changed"), std::string::npos)
      << DaemonLog();
  EXPECT_EQ(States()["a"], "registered");
  auto c = Connect();
  client::Matrix input = RandomMatrix(2, 16, 3);
  auto got = c->Infer("a", input);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(ReferenceInfer(a, input), *got);  // the new version
  ASSERT_TRUE(WaitForStore(1)) << StoredNames();  // the old handle went, the new one came
}

TEST_F(WarmRestartTest, WhatIsUnloadedLeavesTheStore) {
  MakeModel("a", "16,64,8");
  MakeModel("b", "16,8");
  Start({"a", "b"});
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"load", "b"}, &out, &err), 0) << err;
  ASSERT_TRUE(WaitForStore(2)) << StoredNames();
  ASSERT_EQ(Cli({"unload", "a"}, &out, &err), 0) << err;
  ASSERT_TRUE(WaitForStore(1)) << StoredNames();
  EXPECT_EQ(StoredNames().find("wp.w.a."), std::string::npos) << StoredNames();
  KillDaemon();
  Start({"a", "b"});
  std::map<std::string, std::string> states = States();
  EXPECT_EQ(states["a"], "registered");
  EXPECT_EQ(states["b"], "ready");
}

TEST_F(WarmRestartTest, ASmallerBudgetAfterTheRestartParksWhatNoLongerFits) {
  std::string a = MakeModel("a", "64,256,256,8");
  std::string b = MakeModel("b", "64,256,256,8", "relu", "f32", 2);
  const uint64_t each = AccountedBytes(a);
  Start({"a", "b"});
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"load", "b"}, &out, &err), 0) << err;  // b used last
  ASSERT_TRUE(WaitForStore(2)) << StoredNames();
  KillDaemon();
  Start({"a", "b"}, "park_budget = \"64MiB\"\nbudget = " + std::to_string(each + each / 2) + "\n");
  std::map<std::string, std::string> states = States();
  EXPECT_EQ(states["b"], "ready") << "the most recently used stays on the device";
  EXPECT_EQ(states["a"], "parked");
  auto c = Connect();
  client::Matrix input = RandomMatrix(2, 64, 4);
  auto got = c->Infer("a", input);  // unparks a, which evicts b
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(ReferenceInfer(a, input), *got);
}

// Memory that a daemon before this one held is never reused here (its workers may still map it
// while it drains after a takeover): an adopted model dropped for want of room leaves no kept
// region behind.
TEST_F(WarmRestartTest, WeightsKeptButNotAdoptedAreNotReusedForOtherModels) {
  MakeModel("a", "64,256,256,8");
  MakeModel("b", "64,256,256,8", "relu", "f32", 2);
  Start({"a", "b"}, "");
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"load", "b"}, &out, &err), 0) << err;
  ASSERT_TRUE(WaitForStore(2)) << StoredNames();
  KillDaemon();
  Start({"a", "b"}, "capacity = 1\n");  // room for b (used last); a is dropped
  EXPECT_NE(DaemonLog().find("dropping the weights kept of \"a\""), std::string::npos) << DaemonLog();
  auto c = Connect();
  auto status = c->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->devices(0).kept_regions(), 0u) << "a's region went into the cache for reuse";
}

}  // namespace
}  // namespace warmpool::testing

namespace warmpool::testing {
namespace {

// `warmpoold --takeover` (supervisor/takeover.h), without a service manager.
class TakeoverTest : public DaemonTest {
 protected:
  // A second warmpoold on the same socket and instance, taking over from the one running.
  std::unique_ptr<launch::DaemonProcess> StartTakeover() {
    launch::DaemonSpec spec = daemon_->spec();
    spec.args.push_back("--takeover");
    spec.log = dir_ + "/takeover.log";
    auto next = std::make_unique<launch::DaemonProcess>(spec);
    Status started = next->Start();
    EXPECT_TRUE(started.ok()) << started.ToString();
    return next;
  }
};

// One client of the load: keeps `depth` requests in flight and sends each logical request until
// it succeeds once; a reconnect (the old daemon closing its connection) or an UNAVAILABLE refusal
// (it handed over) sends it again on a new connection. Counts what a client must never see.
struct LoadClient {
  std::string socket;
  std::vector<client::Matrix> inputs;
  std::vector<client::Matrix> expected;
  uint32_t requests = 0;                 // at least this many, and more while `running`
  const std::atomic<bool>* running = nullptr;
  uint32_t issued = 0;
  int succeeded = 0, duplicates = 0, wrong = 0, unexpected = 0, reconnects = 0, refused = 0;
  std::string last_problem;

  void Run() {
    std::vector<bool> done;
    std::vector<uint32_t> todo;
    auto more = [&] {
      if (!todo.empty()) return true;
      if (issued >= requests && running->load()) {
      } else if (issued >= requests) {
        return false;
      }
      todo.push_back(issued++);
      done.push_back(false);
      return true;
    };
    auto deadline = std::chrono::steady_clock::now() + 60s;
    while (more() && std::chrono::steady_clock::now() < deadline) {
      auto c = client::Client::Connect(socket);
      if (!c.ok()) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      std::map<uint64_t, uint32_t> in_flight;  // request id -> logical request
      std::vector<uint32_t> again;
      bool broken = false;
      while ((more() || !in_flight.empty()) && !broken) {
        while (in_flight.size() < 4 && more()) {
          const uint32_t logical = todo.back();
          Result<uint64_t> id = SendInfer(**c, "a", inputs[logical % inputs.size()]);
          if (!id.ok()) {
            broken = true;
            break;
          }
          todo.pop_back();
          in_flight[*id] = logical;
        }
        if (broken || in_flight.empty()) break;
        Result<v1::Envelope> reply = (*c)->Receive();
        if (!reply.ok()) {
          broken = true;
          break;
        }
        auto it = in_flight.find(reply->request_id());
        if (it == in_flight.end()) {
          duplicates++;  // an id answered twice, or never sent
          continue;
        }
        const uint32_t logical = it->second;
        in_flight.erase(it);
        if (reply->has_error()) {
          if (reply->error().message().find("reconnect") != std::string::npos) {
            refused++;
            again.push_back(logical);
            broken = true;  // go to the new daemon
          } else {
            unexpected++;
            last_problem = reply->error().message();
            again.push_back(logical);
          }
          continue;
        }
        if (done[logical]) duplicates++;
        done[logical] = true;
        Result<client::Matrix> got = client::FromTensor(reply->infer_reply().output());
        const client::Matrix& want = expected[logical % expected.size()];
        bool same = got.ok() && got->rows == want.rows && got->cols == want.cols;
        for (size_t k = 0; same && k < got->data.size(); k++) same = std::abs(got->data[k] - want.data[k]) < 1e-4f;
        if (!same) wrong++;
        succeeded++;
      }
      // What was in flight on a connection the daemon closed was never accepted: send it again.
      for (auto& [id, logical] : in_flight) todo.push_back(logical);
      for (uint32_t logical : again) todo.push_back(logical);
      if (broken) reconnects++;
    }
  }
};

TEST_F(TakeoverTest, UnderLoadEveryRequestIsAnsweredOnceAndTheNewDaemonReadsNoFile) {
  std::string a = MakeModel("a", "32,256,8");
  StartDaemon("[[models]]\nname = \"a\"\npath = \"" + a + "\"\n");
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  std::vector<client::Matrix> inputs, expected;
  for (uint32_t i = 0; i < 8; i++) {
    inputs.push_back(RandomMatrix(2, 32, 100 + i));
    expected.push_back(ReferenceInfer(a, inputs.back()));
  }
  fs::remove(a);  // the new daemon must not need it
  std::vector<LoadClient> clients(3);
  std::vector<std::thread> threads;
  std::atomic<bool> running{true};
  for (LoadClient& c : clients) {
    c.socket = socket_;
    c.inputs = inputs;
    c.expected = expected;
    c.requests = 200;
    c.running = &running;
  }
  for (LoadClient& c : clients) threads.emplace_back([&c] { c.Run(); });
  std::this_thread::sleep_for(150ms);
  std::unique_ptr<launch::DaemonProcess> next = StartTakeover();
  // The old daemon hands over, drains and exits cleanly; its workers go with it.
  EXPECT_EQ(daemon_->Wait(20000), 0) << DaemonLog();
  std::this_thread::sleep_for(200ms);  // the load goes on against the new daemon
  running = false;
  for (std::thread& t : threads) t.join();
  int succeeded = 0;
  for (const LoadClient& c : clients) {
    EXPECT_EQ(c.succeeded, static_cast<int>(c.issued)) << "every request answered";
    EXPECT_GE(c.issued, 200u);
    EXPECT_EQ(c.duplicates, 0) << "none twice";
    EXPECT_EQ(c.wrong, 0);
    EXPECT_EQ(c.unexpected, 0) << c.last_problem;
    succeeded += c.succeeded;
  }
  int moved = 0;
  for (const LoadClient& c : clients) moved += c.reconnects;
  EXPECT_GT(moved, 0) << "the clients moved to the new daemon";
  const std::string old_log = DaemonLog();
  EXPECT_NE(old_log.find("handed the socket and 1 kept weights to a new warmpoold"), std::string::npos) << old_log;
  // From here the fixture watches the new daemon (its TearDown stops it and checks what it leaves).
  daemon_ = std::move(next);
  WorkerPids();
  const std::string log = daemon_->Log();
  EXPECT_NE(log.find("adopted \"a\" ready"), std::string::npos) << log;
  EXPECT_NE(log.find("(taken over)"), std::string::npos) << log;
  EXPECT_EQ(log.find("loading \"a\""), std::string::npos) << log;
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto got = c->Infer("a", inputs[0]);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectNear(expected[0], *got);
}

// The manifest a daemon hands over records the version the weights were read from, not what the
// registry says of a file deleted since (nothing): so a second takeover adopts them as the first did.
TEST_F(TakeoverTest, AModelWhoseFileWasDeletedIsKeptAcrossTwoTakeovers) {
  std::string a = MakeModel("a", "16,32,8");
  StartDaemon("[[models]]\nname = \"a\"\npath = \"" + a + "\"\n");
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  const client::Matrix input = RandomMatrix(2, 16, 3);
  const client::Matrix expected = ReferenceInfer(a, input);
  fs::remove(a);
  for (int round = 1; round <= 2; round++) {
    SCOPED_TRACE(round);
    launch::DaemonSpec spec = daemon_->spec();
    if (round == 1) spec.args.push_back("--takeover");
    spec.log = dir_ + "/takeover" + std::to_string(round) + ".log";
    auto next = std::make_unique<launch::DaemonProcess>(spec);
    ASSERT_TRUE(next->Start().ok());
    EXPECT_EQ(daemon_->Wait(20000), 0) << DaemonLog();
    daemon_ = std::move(next);
    WorkerPids();
    const std::string log = daemon_->Log();
    EXPECT_NE(log.find("adopted \"a\" ready"), std::string::npos) << log;
    auto got = Connect()->Infer("a", input);
    ASSERT_TRUE(got.ok()) << got.status().ToString() << "\n" << log;
    ExpectNear(expected, *got);
  }
}

TEST_F(TakeoverTest, WithNoDaemonToTakeOverFromItSaysSo) {
  std::string out, err;
  int rc = RunProgram({BinDir() + "/warmpoold", "--socket", socket_, "--instance", instance_, "--takeover"}, &out, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("--takeover: no daemon answers on"), std::string::npos) << err;
}

TEST_F(WarmRestartTest, ADaemonUnderAServiceManagerRefusesATakeover) {
  MakeModel("a", "16,8");
  Start({"a"});
  std::string out, err;
  int rc = RunProgram({BinDir() + "/warmpoold", "--socket", socket_, "--instance", instance_, "--takeover"}, &out, &err);
  EXPECT_EQ(rc, 2);
  EXPECT_NE(err.find("this daemon runs under a service manager"), std::string::npos)
      << "refused by the running daemon: " << err;
  EXPECT_EQ(States()["a"], "registered") << "and goes on serving";
}

}  // namespace
}  // namespace warmpool::testing
