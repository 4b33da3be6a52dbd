// Warm models across a restart of warmpoold (supervisor/warm_store.h): under a stand-in for
// systemd's descriptor store (launch/service_manager_double.h), the weights a daemon held survive
// its SIGKILL or its stop, and the next daemon serves them without reading a file: the files are
// deleted before it starts.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
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

  // Until the store holds a manifest and `handles` kept handles (the daemon writes it within
  // Daemon::kKeptSyncMs of a change).
  bool WaitForStore(size_t handles) {
    for (int i = 0; i < 200; i++) {
      size_t manifests = 0, kept = 0;
      for (const auto& [name, count] : service_manager_->Stored()) {
        (name.rfind("wp.manifest.", 0) == 0 ? manifests : kept) += count;
      }
      if (manifests == 1 && kept == handles) return true;
      std::this_thread::sleep_for(20ms);
    }
    return false;
  }

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

TEST_F(WarmRestartTest, AStopAndStartKeepsThemToo) {
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

}  // namespace
}  // namespace warmpool::testing
