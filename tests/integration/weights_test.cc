// Weights held by the supervisor: a worker's death frees nothing, and a worker attaches the resident
// weights again without reading the model file (invariant 7).
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

class WeightsTest : public DaemonTest {};

TEST_F(WeightsTest, WeightsSurviveTheWorkerWithoutTheFile) {
  std::string path = MakeModel("m", "32,128,8", "gelu", "f16");
  StartDaemon();
  auto client = Connect();
  client::Matrix input = RandomMatrix(3, 32, 1);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  auto used_before = client->GetStatus()->devices(0).used_bytes();

  // The file is gone and so is the worker that read it.
  std::filesystem::remove(path);
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 1);
  int slot = ps->models(0).worker();
  ASSERT_GE(slot, 0);
  pid_t pid = client->GetStatus()->workers(slot).pid();
  kill(pid, SIGKILL);
  for (int i = 0; i < 200; i++) {
    auto s = client->GetStatus();
    if (s->workers(slot).pid() != pid && s->workers(slot).state() == "idle") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Still accounted, still ready (no replica attached until a request needs one).
  auto after = client->Ps();
  ASSERT_EQ(after->models_size(), 1);
  EXPECT_EQ(after->models(0).state(), "ready");
  EXPECT_EQ(after->models(0).replicas(), 0u);
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), used_before);

  auto out = client->Infer("m", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(expected, *out);
  auto served = client->Ps();
  EXPECT_EQ(served->models(0).replicas(), 1u);
  EXPECT_NE(DaemonLog().find("attaching the resident weights of \"m\""), std::string::npos);
}

TEST_F(WeightsTest, RequestsInFlightWhenTheWorkerDiesAreServedFromTheHeldWeights) {
  std::string path = MakeModel("slow", "256,1024,1024,256");
  StartDaemon();
  auto client = Connect();
  ASSERT_TRUE(client->Load("slow").ok());
  std::filesystem::remove(path);  // a reload from the file would fail: only an attach can serve
  client::Matrix input = RandomMatrix(64, 256, 2);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 10; i++) {
    ids.push_back(*client->SendInfer("slow", input));
  }
  ASSERT_TRUE(client->Wait(ids[0]).ok());
  int slot = client->Ps()->models(0).worker();
  ASSERT_GE(slot, 0);
  kill(client->GetStatus()->workers(slot).pid(), SIGKILL);
  for (size_t i = 1; i < ids.size(); i++) {
    auto reply = client->Wait(ids[i]);
    ASSERT_TRUE(reply.ok());
    EXPECT_TRUE(reply->has_infer_reply()) << reply->DebugString();
  }
}

TEST_F(WeightsTest, UnloadReleasesHeldWeightsAndEvictionPrefersNothingSpecial) {
  std::string a = MakeModel("a", "64,256,64", "relu", "f32", 1);
  MakeModel("b", "64,256,64", "relu", "f32", 2);
  StartDaemon(fmt::format("[pool]\nbudget = {}\n", AccountedBytes(a) * 3 / 2));
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  // Detach a (its worker dies), then b needs the room: the detached a is evicted at once.
  int slot = client->Ps()->models(0).worker();
  kill(client->GetStatus()->workers(slot).pid(), SIGKILL);
  for (int i = 0; i < 200 && client->Ps()->models(0).replicas() != 0; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(client->Load("b").ok());
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 1);
  EXPECT_EQ(ps->models(0).name(), "b");
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), AccountedBytes(a));
  ASSERT_TRUE(client->Unload("b").ok());
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), 0u);
}

TEST_F(WeightsTest, ReplicasShareOneCopyAndSurviveEachOther) {
  std::string path = MakeModel("m", "64,256,64", "relu", "f32", 3);
  StartDaemon("[[models]]\nname = \"m\"\npath = \"models/m.safetensors\"\nreplicas = 2\n");
  auto client = Connect();
  ASSERT_TRUE(client->Load("m").ok());
  auto replicas = [&] {
    auto ps = client->Ps();
    return ps.ok() && ps->models_size() == 1 ? ps->models(0).replicas() : 0u;
  };
  for (int i = 0; i < 300 && replicas() != 2; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(replicas(), 2u);
  // One copy of the weights, a workspace per replica.
  uint64_t weights = (64 * 256 + 256 + 256 * 64 + 64) * 4;
  uint64_t workspace = AccountedBytes(path) - weights;
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), weights + 2 * workspace);

  // A replica's worker dies: the other keeps serving, without any attach or load.
  client::Matrix input = RandomMatrix(4, 64, 3);
  client::Matrix expected = ReferenceInfer(path, input);
  pid_t victim = client->GetStatus()->workers(0).pid();
  kill(victim, SIGKILL);
  for (int i = 0; i < 20; i++) {
    auto out = client->Infer("m", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(expected, *out);
  }
  // The respawned worker becomes a replica again.
  for (int i = 0; i < 300 && replicas() != 2; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(replicas(), 2u);
  ASSERT_TRUE(client->Unload("m").ok());
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), 0u);
}

}  // namespace
}  // namespace warmpool::testing
