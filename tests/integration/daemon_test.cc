// The pool end to end: load, infer, unload, LRU eviction, alternation, concurrency, the CLI contract.
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

using nlohmann::json;

TEST_F(DaemonTest, LoadInferUnloadThroughTheCli) {
  std::string path = MakeModel("mlp", "16,32,4", "gelu");
  MakeModel("half", "16,8,4", "tanh", "f16", 2);
  StartDaemon();

  std::string out, err;
  ASSERT_EQ(Cli({"models", "--json"}, &out, &err), 0) << err;
  json models = json::parse(out);
  ASSERT_EQ(models.size(), 2u);
  EXPECT_EQ(models[1]["name"], "mlp");
  EXPECT_EQ(models[1]["engine"], "dense");
  EXPECT_EQ(models[1]["path"], path);
  EXPECT_EQ(models[1]["state"], "registered");
  EXPECT_EQ(models[1]["bytes"], (16 * 32 + 32 + 32 * 4 + 4) * 4);

  ASSERT_EQ(Cli({"load", "mlp"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("mlp ready"), std::string::npos) << out;

  client::Matrix input = RandomMatrix(3, 16, 7);
  json rows = json::array();
  for (uint32_t r = 0; r < 3; r++) {
    rows.push_back(std::vector<float>(input.data.begin() + r * 16, input.data.begin() + r * 16 + 16));
  }
  ASSERT_EQ(Cli({"infer", "mlp", "--input", "-", "--json"}, &out, &err, rows.dump()), 0) << err;
  json result = json::parse(out);
  client::Matrix actual{3, 4, {}};
  for (const auto& row : result) {
    for (const auto& v : row) actual.data.push_back(v.get<float>());
  }
  ExpectNear(ReferenceInfer(path, input), actual);

  ASSERT_EQ(Cli({"ps", "--json"}, &out, &err), 0) << err;
  json ps = json::parse(out);
  ASSERT_EQ(ps.size(), 1u);
  EXPECT_EQ(ps[0]["name"], "mlp");
  EXPECT_EQ(ps[0]["state"], "ready");
  EXPECT_EQ(ps[0]["bytes"], AccountedBytes(path));
  EXPECT_EQ(ps[0]["inflight"], 0);
  EXPECT_EQ(ps[0]["replicas"], 1);
  EXPECT_GT(ps[0]["last_used"].get<int64_t>(), 1700000000);
  EXPECT_TRUE(ps[0]["expires_in"].is_null());

  ASSERT_EQ(Cli({"status", "--json"}, &out, &err), 0) << err;
  json status = json::parse(out);
  EXPECT_EQ(status["backend"], "host");
  EXPECT_EQ(status["devices"][0]["used_bytes"], AccountedBytes(path));
  EXPECT_EQ(status["workers"].size(), 2u);
  EXPECT_EQ(status["inflight"], 0);
  EXPECT_EQ(status["queued"], 0);

  ASSERT_EQ(Cli({"unload", "mlp"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"ps", "--json"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out).size(), 0u);
  ASSERT_EQ(Cli({"status", "--json"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)["devices"][0]["used_bytes"], 0);

  // Unloading what is not loaded is an error that says so.
  EXPECT_EQ(Cli({"unload", "mlp"}, &out, &err), 1);
  EXPECT_NE(err.find("error: FAILED_PRECONDITION: model \"mlp\" is not loaded"), std::string::npos) << err;

  // Inference on a registered model loads it on demand; f16 weights too.
  ASSERT_EQ(Cli({"infer", "half", "--random", "2"}, &out, &err), 0) << err;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2);
}

TEST_F(DaemonTest, LeastRecentlyUsedIsEvictedWhenAThirdModelDoesNotFit) {
  std::string a = MakeModel("a", "64,256,64", "relu", "f32", 1);
  std::string b = MakeModel("b", "64,256,64", "relu", "f32", 2);
  std::string c = MakeModel("c", "64,256,64", "relu", "f32", 3);
  uint64_t each = AccountedBytes(a);
  StartDaemon(fmt::format("[pool]\nbudget = {}\n", each * 2 + each / 2));
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Load("b").ok());
  client::Matrix input = RandomMatrix(2, 64, 1);
  auto out = client->Infer("a", input);  // a becomes the most recently used
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(ReferenceInfer(a, input), *out);

  out = client->Infer("c", input);  // needs room: b is the least recently used
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(ReferenceInfer(c, input), *out);

  auto ps = client->Ps();
  ASSERT_TRUE(ps.ok());
  std::vector<std::string> resident;
  for (const auto& m : ps->models()) resident.push_back(m.name());
  EXPECT_EQ(resident, (std::vector<std::string>{"a", "c"}));  // LRU order: a, then c
  auto status = client->GetStatus();
  EXPECT_EQ(status->devices(0).used_bytes(), 2 * each);
  EXPECT_LE(status->devices(0).used_bytes(), status->devices(0).budget_bytes());
}

TEST_F(DaemonTest, TwoModelsAlternatingInABudgetForOne) {
  std::string a = MakeModel("a", "32,128,8", "relu", "f32", 1);
  std::string b = MakeModel("b", "32,128,8", "tanh", "bf16", 2);
  StartDaemon(fmt::format("[pool]\nbudget = {}\n", AccountedBytes(a) + AccountedBytes(a) / 2));
  auto client = Connect();
  client::Matrix input = RandomMatrix(4, 32, 3);
  client::Matrix expect_a = ReferenceInfer(a, input), expect_b = ReferenceInfer(b, input);
  for (int i = 0; i < 10; i++) {
    auto out = client->Infer(i % 2 ? "b" : "a", input);
    ASSERT_TRUE(out.ok()) << i << ": " << out.status().ToString();
    ExpectNear(i % 2 ? expect_b : expect_a, *out);
  }
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 1);
  EXPECT_EQ(ps->models(0).name(), "b");
}

TEST_F(DaemonTest, CapacityLimitEvictsByCount) {
  std::string a = MakeModel("a", "8,8", "none", "f32", 1);
  MakeModel("b", "8,8", "none", "f32", 2);
  StartDaemon("[pool]\ncapacity = 1\n");
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Load("b").ok());
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 1);
  EXPECT_EQ(ps->models(0).name(), "b");
}

TEST_F(DaemonTest, FiftyConcurrentClientsPipelining) {
  std::string a = MakeModel("a", "32,64,8", "relu", "f32", 1);
  std::string b = MakeModel("b", "32,16,16,4", "gelu", "f16", 2);
  // All fifty are one user, whose share of unanswered requests is 512 by default: this is about
  // pipelining, not about shares.
  StartDaemon("[limits]\nmax_requests_per_peer = 1000\n");
  client::Matrix input_a = RandomMatrix(2, 32, 11), input_b = RandomMatrix(5, 32, 12);
  client::Matrix expect_a = ReferenceInfer(a, input_a), expect_b = ReferenceInfer(b, input_b);
  constexpr int kClients = 50, kPerClient = 20;
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < kClients; t++) {
    threads.emplace_back([&, t] {
      auto c = client::Client::Connect(socket_);
      ASSERT_TRUE(c.ok());
      std::vector<std::pair<uint64_t, bool>> sent;
      for (int i = 0; i < kPerClient; i++) {
        bool use_a = (t + i) % 2 == 0;
        auto id = (*c)->SendInfer(use_a ? "a" : "b", use_a ? input_a : input_b);
        ASSERT_TRUE(id.ok());
        sent.emplace_back(*id, use_a);
      }
      // Replies are matched by request_id; wait for them in reverse to exercise the stash.
      for (auto it = sent.rbegin(); it != sent.rend(); ++it) {
        auto reply = (*c)->Wait(it->first);
        ASSERT_TRUE(reply.ok()) << reply.status().ToString();
        ASSERT_EQ(reply->request_id(), it->first);
        ASSERT_TRUE(reply->has_infer_reply()) << reply->DebugString();
        auto m = client::FromTensor(reply->infer_reply().output());
        ASSERT_TRUE(m.ok());
        ExpectNear(it->second ? expect_a : expect_b, *m);
        good++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(good.load(), kClients * kPerClient);
}

TEST_F(DaemonTest, RunsWithNoConfigFile) {
  MakeModel("tiny", "4,4", "none");
  StartDaemonWithDefaults();
  std::string out, err;
  ASSERT_EQ(Cli({"infer", "tiny", "--random", "1", "--json"}, &out, &err), 0) << err;
  EXPECT_EQ(json::parse(out)[0].size(), 4u);
}

TEST_F(DaemonTest, EchoEngineFromConfig) {
  StartDaemon("[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  std::string out, err;
  ASSERT_EQ(Cli({"infer", "echo", "--input", "-", "--json"}, &out, &err, "[[1.5, -2], [3, 4.25]]"), 0) << err;
  EXPECT_EQ(json::parse(out), json::parse("[[1.5, -2.0], [3.0, 4.25]]"));
}

}  // namespace
}  // namespace warmpool::testing
