// Pool policies: pinning, keep_alive expiry and its exceptions, preload.
#include <filesystem>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

using nlohmann::json;

class PoolTest : public DaemonTest {
 protected:
  std::vector<std::string> Resident(client::Client& c) {
    std::vector<std::string> names;
    auto ps = c.Ps();
    if (!ps.ok()) return names;
    for (const auto& m : ps->models()) {
      if (m.state() == "ready") names.push_back(m.name());
    }
    return names;
  }
  void WaitFor(const std::function<bool()>& done) {
    for (int i = 0; i < 300 && !done(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
};

TEST_F(PoolTest, PinnedModelsAreNeverEvicted) {
  std::string a = MakeModel("a", "64,256,64", "relu", "f32", 1);
  MakeModel("b", "64,256,64", "relu", "f32", 2);
  StartDaemon(fmt::format("[pool]\nbudget = {}\n", AccountedBytes(a) * 3 / 2));
  std::string out, err;
  ASSERT_EQ(Cli({"load", "a"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"pin", "a"}, &out, &err), 0) << err;
  EXPECT_EQ(out, "a pinned\n");
  // b does not fit beside a, and a may not go.
  EXPECT_EQ(Cli({"load", "b"}, &out, &err), 1);
  EXPECT_NE(err.find("RESOURCE_EXHAUSTED"), std::string::npos) << err;
  EXPECT_NE(err.find("pinned: a"), std::string::npos) << err;
  ASSERT_EQ(Cli({"ps", "--json"}, &out, &err), 0);
  EXPECT_EQ(json::parse(out)[0]["pinned"], true);
  ASSERT_EQ(Cli({"unpin", "a"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"load", "b"}, &out, &err), 0) << err;
  auto client = Connect();
  EXPECT_EQ(Resident(*client), std::vector<std::string>{"b"});
  EXPECT_EQ(Cli({"pin", "nope"}, &out, &err), 1);
  EXPECT_NE(err.find("NOT_FOUND"), std::string::npos);
}

TEST_F(PoolTest, KeepAliveReleasesIdleModelsButNeverTheLastOrTheMostRecent) {
  MakeModel("a", "8,8", "none", "f32", 1);
  MakeModel("b", "8,8", "none", "f32", 2);
  MakeModel("c", "8,8", "none", "f32", 3);
  StartDaemon("[pool]\nkeep_alive = \"300ms\"\n");
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Load("b").ok());
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 2);
  EXPECT_TRUE(ps->models(0).has_expiry());
  EXPECT_LE(ps->models(0).expires_in(), 1);
  // a expires; b is the most recently used and the last warm one: it stays.
  WaitFor([&] { return Resident(*client).size() == 1; });
  EXPECT_EQ(Resident(*client), std::vector<std::string>{"b"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(Resident(*client), std::vector<std::string>{"b"});

  // A request's keep_alive overrides the model's: -1 keeps c until evicted.
  std::string out, err;
  ASSERT_EQ(Cli({"infer", "c", "--random", "1", "--keep-alive", "-1"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"infer", "a", "--random", "1"}, &out, &err), 0) << err;
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  auto names = Resident(*client);
  EXPECT_NE(std::find(names.begin(), names.end(), "c"), names.end());
  ASSERT_EQ(Cli({"ps", "--json"}, &out, &err), 0);
  for (const auto& m : json::parse(out)) {
    if (m["name"] == "c") {
      EXPECT_TRUE(m["expires_in"].is_null());
    }
  }
}

TEST_F(PoolTest, PreloadLoadsAtStart) {
  MakeModel("a", "8,8", "none", "f32", 1);
  MakeModel("b", "8,8", "none", "f32", 2);
  StartDaemon("[pool]\npreload = [\"b\", \"missing\"]\n");
  auto client = Connect();
  WaitFor([&] { return Resident(*client) == std::vector<std::string>{"b"}; });
  EXPECT_EQ(Resident(*client), std::vector<std::string>{"b"});
  EXPECT_NE(DaemonLog().find("preload: model \"missing\" is not registered"), std::string::npos);
  EXPECT_NE(DaemonLog().find("preload complete"), std::string::npos);
}

std::map<std::string, std::string> States(client::Client& c) {
  std::map<std::string, std::string> states;
  auto ps = c.Ps();
  if (ps.ok()) {
    for (const auto& m : ps->models()) states[m.name()] = m.state();
  }
  return states;
}

TEST_F(PoolTest, ParkKeepsAHostCopyAndUnparkServesFromIt) {
  std::string path = MakeModel("m", "32,128,8", "gelu", "bf16", 4);
  StartDaemon("[pool]\npark_budget = \"64MiB\"\n");
  auto client = Connect();
  client::Matrix input = RandomMatrix(2, 32, 4);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  std::string out, err;
  ASSERT_EQ(Cli({"unload", "--park", "m"}, &out, &err), 0) << err;
  EXPECT_EQ(out, "m parked\n");
  EXPECT_EQ(States(*client)["m"], "parked");
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), 0u);
  std::filesystem::remove(path);  // unpark is a memory copy: the file is not needed
  auto result = client->Infer("m", input);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ExpectNear(expected, *result);
  EXPECT_EQ(States(*client)["m"], "ready");
  EXPECT_NE(DaemonLog().find("unparking \"m\""), std::string::npos);
  // Without a park budget, --park says what to do.
  ASSERT_EQ(Cli({"unload", "m"}, &out, &err), 0) << err;
}

TEST_F(PoolTest, ParkWithoutABudgetIsRefusedWithAHint) {
  MakeModel("m", "8,8");
  StartDaemon();
  std::string out, err;
  ASSERT_EQ(Cli({"load", "m"}, &out, &err), 0) << err;
  EXPECT_EQ(Cli({"unload", "--park", "m"}, &out, &err), 1);
  EXPECT_NE(err.find("FAILED_PRECONDITION: model \"m\" cannot be parked: parking is disabled"), std::string::npos) << err;
}

TEST_F(PoolTest, EvictionParksAndSingleActiveSwitchesByParking) {
  std::string a = MakeModel("a", "64,256,64", "relu", "f32", 1);
  std::string b = MakeModel("b", "64,256,64", "relu", "f32", 2);
  StartDaemon("[pool]\nsingle_active = true\npark_budget = \"64MiB\"\n");
  auto client = Connect();
  client::Matrix input = RandomMatrix(1, 64, 9);
  for (int i = 0; i < 4; i++) {
    const std::string& path = i % 2 ? b : a;
    auto out = client->Infer(i % 2 ? "b" : "a", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(ReferenceInfer(path, input), *out);
    auto states = States(*client);
    EXPECT_EQ(states[i % 2 ? "b" : "a"], "ready");
    if (i > 0) {
      EXPECT_EQ(states[i % 2 ? "a" : "b"], "parked");
    }
  }
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), AccountedBytes(b));
}

TEST_F(PoolTest, UnloadAllParksAndMaxCachedDropsTheOldestParked) {
  MakeModel("a", "8,8", "none", "f32", 1);
  MakeModel("b", "8,8", "none", "f32", 2);
  MakeModel("c", "8,8", "none", "f32", 3);
  StartDaemon("[pool]\npark_budget = \"64MiB\"\nmax_cached = 2\n");
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Load("b").ok());
  std::string out, err;
  ASSERT_EQ(Cli({"unload", "--all"}, &out, &err), 0) << err;
  EXPECT_EQ(out, "unloaded 2 model(s), 2 parked\n");
  EXPECT_EQ(States(*client), (std::map<std::string, std::string>{{"a", "parked"}, {"b", "parked"}}));
  // A third cached entry: the least recently used parked one (a) goes.
  ASSERT_TRUE(client->Load("c").ok());
  EXPECT_EQ(States(*client), (std::map<std::string, std::string>{{"b", "parked"}, {"c", "ready"}}));
}

}  // namespace
}  // namespace warmpool::testing
