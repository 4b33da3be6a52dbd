// Weights held by the supervisor: a worker's death frees nothing, and a worker attaches the resident
// weights again without reading the model file (invariant 7).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "engines/safetensors.h"
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

// Bytes of every memfd the process holds open (weights it keeps, and freed memory it keeps for reuse).
struct HeldMemfds {
  size_t count = 0;
  uint64_t bytes = 0;
};
HeldMemfds MemfdsOf(pid_t pid) {
  HeldMemfds held;
  const std::string dir = fmt::format("/proc/{}/fd", pid);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    struct stat st {};
    if (ec || target.rfind("/memfd:", 0) != 0 || stat(entry.path().c_str(), &st) != 0) continue;
    held.count++;
    held.bytes += static_cast<uint64_t>(st.st_size);
  }
  return held;
}

uint64_t WeightBytes(const std::string& path) { return safetensors::ReadHeader(path)->data_bytes; }

// Inodes of the memfds a process holds open, and of those it maps.
std::set<uint64_t> MemfdInodesHeld(pid_t pid) {
  std::set<uint64_t> inodes;
  for (const auto& entry : std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid))) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    struct stat st {};
    if (!ec && target.rfind("/memfd:", 0) == 0 && stat(entry.path().c_str(), &st) == 0) inodes.insert(st.st_ino);
  }
  return inodes;
}
std::set<uint64_t> MemfdInodesMapped(pid_t pid) {
  std::set<uint64_t> inodes;
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:warmpool-weights") == std::string::npos) continue;
    std::istringstream fields(line);
    std::string range, perms, offset, device;
    uint64_t inode = 0;
    fields >> range >> perms >> offset >> device >> inode;
    inodes.insert(inode);
  }
  return inodes;
}

// Workers keep mappings of memory they let go while the daemon keeps it for reuse; what the
// daemon closed, no worker may still map (its memory would never be freed). Waits a little for the
// workers to hear of it.
void ExpectNoWorkerMapsWhatTheDaemonLetGo(client::Client& client, pid_t daemon) {
  std::string stray;
  for (int i = 0; i < 200; i++) {
    const std::set<uint64_t> held = MemfdInodesHeld(daemon);
    stray.clear();
    Result<v1::StatusReply> status = client.GetStatus();
    ASSERT_TRUE(status.ok()) << status.status().ToString();
    for (const v1::WorkerStatus& w : status->workers()) {
      if (w.pid() <= 0) continue;
      for (uint64_t inode : MemfdInodesMapped(static_cast<pid_t>(w.pid()))) {
        if (held.count(inode) == 0) stray += fmt::format(" worker {} maps inode {};", w.slot(), inode);
      }
    }
    if (stray.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "memory the daemon closed is still mapped:" << stray;
}

TEST_F(WeightsTest, FreedMemoryIsReusedByTheNextLoad) {
  std::string a = MakeModel("a", "64,512,64", "relu", "f32", 1);
  std::string b = MakeModel("b", "64,512,64", "gelu", "f16", 2);
  StartDaemon();
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Unload("a").ok());
  for (int i = 0; i < 200 && MemfdsOf(DaemonPid()).count != 1; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(MemfdsOf(DaemonPid()).bytes, WeightBytes(a)) << "a's memory is kept, not given back";
  ASSERT_TRUE(client->Load("b").ok());
  EXPECT_NE(DaemonLog().find("reuses"), std::string::npos) << DaemonLog();
  // b's weights (half a's bytes) in a's old pages, resized: what it computes is b's.
  EXPECT_EQ(MemfdsOf(DaemonPid()).bytes, WeightBytes(b));
  client::Matrix input = RandomMatrix(5, 64, 3);
  auto out = client->Infer("b", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(ReferenceInfer(b, input), *out);
  // And back: a's weights in the same pages again (the worker's kept mapping, grown), unpark too.
  ASSERT_TRUE(client->Unload("b").ok());
  ASSERT_TRUE(client->Load("a").ok());
  auto again = client->Infer("a", input);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ExpectNear(ReferenceInfer(a, input), *again);
  ExpectNoWorkerMapsWhatTheDaemonLetGo(*client, DaemonPid());
  ExpectQuiescentAndValid();
}

TEST_F(WeightsTest, KeptMemoryNeverPassesTheBudget) {
  std::string a = MakeModel("a", "64,512,64", "relu", "f32", 1);
  MakeModel("b", "64,512,64", "relu", "f32", 2);
  std::string c = MakeModel("c", "64,1000,64", "relu", "f32", 3);
  const uint64_t budget = 2 * AccountedBytes(a);
  // c fits alone, but beside c there is no room for the second of a's and b's freed regions.
  ASSERT_LE(AccountedBytes(c), budget);
  ASSERT_LT(budget - AccountedBytes(c), WeightBytes(a));
  StartDaemon(fmt::format("[pool]\nbudget = {}\n", budget));
  auto client = Connect();
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Load("b").ok());
  ASSERT_TRUE(client->Unload("a").ok());
  ASSERT_TRUE(client->Unload("b").ok());
  for (int i = 0; i < 200 && MemfdsOf(DaemonPid()).count != 2; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(MemfdsOf(DaemonPid()).count, 2u) << "both freed regions kept while nothing is loaded";
  ASSERT_TRUE(client->Load("c").ok());
  // One region grew into c's weights; the other no longer fits beside c and was closed.
  HeldMemfds held = MemfdsOf(DaemonPid());
  EXPECT_EQ(held.count, 1u);
  EXPECT_EQ(held.bytes, WeightBytes(c));
  EXPECT_LE(held.bytes + client->GetStatus()->devices(0).used_bytes() - WeightBytes(c), budget);
  ExpectNoWorkerMapsWhatTheDaemonLetGo(*client, DaemonPid());
  client::Matrix input = RandomMatrix(2, 64, 4);
  auto out = client->Infer("c", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(ReferenceInfer(c, input), *out);
}

}  // namespace
}  // namespace warmpool::testing
