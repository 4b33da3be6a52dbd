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
#include "tests/unit/tiny_model.h"

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

// A parked language model's KV cache is kept beside its copy (wp.k.*), and the next daemon gives it
// back to the copy it adopts: the prompt computed before the restart is in the prefix cache after
// the unpark.
TEST_F(WarmRestartTest, AParkedLanguageModelKeepsItsPrefixCacheAcrossARestart) {
  WriteTinyModel(models_dir_ + "/tiny");
  Start({}, "park_budget = \"100MiB\"\n");
  std::string prompt;
  for (int i = 0; i < 8; ++i) prompt += "You may convey verbatim copies of the Program's source code. ";
  v1::GenerateRequest request;
  request.set_model("tiny");
  request.set_prompt(prompt);
  request.set_max_tokens(8);
  request.set_temperature(0);
  auto c = Connect();
  auto before = c->Generate(request);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  ASSERT_GT(before->prompt_tokens(), 64u);
  c.reset();
  std::string out, err;
  ASSERT_EQ(Cli({"unload", "--park", "tiny"}, &out, &err), 0) << err;
  ASSERT_TRUE(WaitForStore(2)) << StoredNames();
  EXPECT_NE(StoredNames().find("wp.k.tiny."), std::string::npos) << StoredNames();

  KillDaemon();
  Start({}, "park_budget = \"100MiB\"\n");
  EXPECT_EQ(States()["tiny"], "parked");
  EXPECT_NE(DaemonLog().find("adopted the KV cache of \"tiny\""), std::string::npos) << DaemonLog();
  c = Connect();
  auto after = c->Generate(request);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->text(), before->text());
  EXPECT_EQ(after->cached_prompt_tokens(), (before->prompt_tokens() - 1) / 64 * 64);
}

}  // namespace
}  // namespace warmpool::testing
