// The cuda backend end to end, against the driver test double (tests/cuda_double): warmpoold
// starts device 0's memory owner, workers get device memory from it through the supervisor and
// share it by descriptor, a worker's SIGKILL frees nothing, an owner's SIGKILL makes the models
// load again from their files. What the double cannot show (GPU kernels, real device memory
// limits, timing) scripts/gpu-check.sh measures on a GPU.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

class CudaTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    launch_env_ = {std::string("LD_LIBRARY_PATH=") + WARMPOOL_FAKE_CUDA_DIR, "WARMPOOL_FAKE_CUDA_MEMORY=4294967296"};
  }
  pid_t OwnerPid() { return launch::ChildNamed(DaemonPid(), "warmpool-owner"); }
  // SIGKILLs the worker serving `model`, waits for its replacement, and expects the model to answer
  // as before (from the held weights: nothing else is left to serve it from).
  void KillItsWorkerAndExpectTheSameAnswer(client::Client& client, const std::string& model,
                                           const client::Matrix& input, const client::Matrix& expected) {
    int slot = client.Ps()->models(0).worker();
    ASSERT_GE(slot, 0);
    kill(client.GetStatus()->workers(slot).pid(), SIGKILL);
    WaitForIdleWorkers(client);
    auto out = client.Infer(model, input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(expected, *out);
  }
  void WaitForIdleWorkers(client::Client& client) {
    for (int i = 0; i < 300; i++) {
      auto s = client.GetStatus();
      bool idle = s.ok() && std::all_of(s->workers().begin(), s->workers().end(),
                                        [](const v1::WorkerStatus& w) { return w.state() == "idle"; });
      if (idle) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
};

TEST_F(CudaTest, ServesFromDeviceMemorySharedByTheOwner) {
  std::string path = MakeModel("m", "32,128,8", "gelu", "f16");
  StartDaemon("[[models]]\nname = \"m\"\npath = \"models/m.safetensors\"\nreplicas = 2\n", {"--backend", "cuda"});
  auto client = Connect();
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->backend(), "cuda");
  EXPECT_EQ(status->devices(0).kind(), "cuda");
  EXPECT_EQ(status->devices(0).name(), "warmpool CUDA test double 0");
  EXPECT_EQ(status->devices(0).total_bytes(), 4294967296u);
  EXPECT_GT(OwnerPid(), 0);
  client::Matrix input = RandomMatrix(5, 32, 2);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  for (int i = 0; i < 4; i++) {
    auto out = client->Infer("m", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(expected, *out);
  }
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 1);
  EXPECT_EQ(ps->models(0).replicas(), 2u) << "two workers map one copy of the weights";
  EXPECT_NE(DaemonLog().find("backend cuda"), std::string::npos);
}

TEST_F(CudaTest, AWorkersDeathFreesNothingAndTheFileIsNotReadAgain) {
  std::string path = MakeModel("m", "32,128,8");
  StartDaemon("", {"--backend", "cuda"});
  auto client = Connect();
  client::Matrix input = RandomMatrix(3, 32, 1);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  std::filesystem::remove(path);  // only an attach of the held weights can serve from now on
  KillItsWorkerAndExpectTheSameAnswer(*client, "m", input, expected);
  EXPECT_NE(DaemonLog().find("attaching the resident weights of \"m\""), std::string::npos);
}

TEST_F(CudaTest, ParkedWeightsComeBackFromHostMemory) {
  std::string path = MakeModel("m", "32,128,8", "tanh", "bf16");
  StartDaemon("[pool]\npark_budget = \"16MiB\"\n", {"--backend", "cuda"});
  auto client = Connect();
  client::Matrix input = RandomMatrix(2, 32, 3);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  ASSERT_EQ(Cli({"unload", "m", "--park"}), 0);
  EXPECT_EQ(client->Ps()->models(0).state(), "parked");
  std::filesystem::remove(path);  // the unpark copies from host memory, not from the file
  auto out = client->Infer("m", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(expected, *out);
  EXPECT_EQ(client->Ps()->models(0).state(), "ready");
}

TEST_F(CudaTest, AnOwnersDeathReloadsItsModelsFromTheirFiles) {
  std::string path = MakeModel("m", "32,128,8");
  StartDaemon("", {"--backend", "cuda"});
  auto client = Connect();
  client::Matrix input = RandomMatrix(3, 32, 4);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  pid_t owner = OwnerPid();
  ASSERT_GT(owner, 0);
  kill(owner, SIGKILL);
  for (int i = 0; i < 300 && (OwnerPid() <= 0 || OwnerPid() == owner); i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GT(OwnerPid(), 0) << "the owner is started again";
  WaitForIdleWorkers(*client);
  auto out = client->Infer("m", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(expected, *out);
  std::string log = DaemonLog();
  EXPECT_NE(log.find("the memory of device 0 is gone"), std::string::npos) << log;
  EXPECT_NE(log.find("loading \"m\""), log.rfind("loading \"m\"")) << "loaded twice: again from its file";
  EXPECT_EQ(log.find("model \"m\" failed"), std::string::npos) << "no model is blamed for a lost device";
  ExpectQuiescentAndValid();
}

TEST_F(CudaTest, LegacyIpcSharingServesAndSurvivesAWorker) {
  std::string path = MakeModel("m", "16,64,4");
  StartDaemon("[cuda]\nsharing = \"legacy\"\n", {"--backend", "cuda"});
  auto client = Connect();
  client::Matrix input = RandomMatrix(2, 16, 5);
  client::Matrix expected = ReferenceInfer(path, input);
  ASSERT_TRUE(client->Load("m").ok());
  KillItsWorkerAndExpectTheSameAnswer(*client, "m", input, expected);
  EXPECT_NE(DaemonLog().find("sharing legacy"), std::string::npos);
}

TEST_F(CudaTest, AutoPicksCudaWhenAGpuWorksAndSaysSo) {
  MakeModel("m", "8,8");
  StartDaemon("", {"--backend", "auto"});
  EXPECT_EQ(Connect()->GetStatus()->backend(), "cuda");
  EXPECT_NE(DaemonLog().find("backend cuda (a usable GPU was found)"), std::string::npos);
}

TEST_F(CudaTest, AutoFallsBackToHostAndSaysWhy) {
  launch_env_ = {"LD_LIBRARY_PATH=/nonexistent", "WARMPOOL_FAKE_CUDA_DEVICES=0"};
  StartDaemon("", {"--backend", "auto"});
  EXPECT_EQ(Connect()->GetStatus()->backend(), "host");
  EXPECT_NE(DaemonLog().find("backend host (no usable GPU:"), std::string::npos) << DaemonLog();
}

TEST_F(CudaTest, CudaWithoutAUsableGpuIsRefusedWithWhatToDo) {
  std::string out, err;
  std::string env = std::string("LD_LIBRARY_PATH=") + WARMPOOL_FAKE_CUDA_DIR;
  int rc = RunProgram({"/usr/bin/env", env, "WARMPOOL_FAKE_CUDA_DEVICES=0", BinDir() + "/warmpoold", "--backend",
                       "cuda", "--socket", dir_ + "/refused.sock", "--instance", instance_ + "r"},
                      &out, &err);
  EXPECT_EQ(rc, 2) << err;
  EXPECT_NE(err.find("CUDA_ERROR_NO_DEVICE"), std::string::npos) << err;
  EXPECT_NE(err.find("--backend host"), std::string::npos) << err;
}

}  // namespace
}  // namespace warmpool::testing
