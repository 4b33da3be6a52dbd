// The cuda backend end to end, against the driver test double (tests/cuda_double): warmpoold
// starts each device's memory owner, workers get device memory from it through the supervisor and
// share it by descriptor, a worker's SIGKILL frees nothing, an owner's SIGKILL makes the models
// load again from their files. What the double cannot show (GPU kernels, real device memory
// limits, timing) scripts/gpu-check.sh measures on a GPU.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <thread>

#include "tests/integration/daemon_fixture.h"
#include "tests/unit/tiny_model.h"

namespace warmpool::testing {
namespace {

class CudaTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    launch_env_ = {std::string("LD_LIBRARY_PATH=") + WARMPOOL_FAKE_CUDA_DIR, "WARMPOOL_FAKE_CUDA_MEMORY=4294967296"};
  }
  pid_t OwnerPid(uint32_t device = 0) {
    return launch::ChildNamed(DaemonPid(), "warmpool-owner", {"--device", std::to_string(device)});
  }
  // Waits for the device's owner to be another process than `old` (the killed one, which may
  // still be found as a zombie until the daemon reaps it); that owner's pid, or -1.
  pid_t WaitForAnotherOwner(pid_t old, uint32_t device = 0) {
    for (int i = 0; i < 300; i++) {
      pid_t now = OwnerPid(device);
      if (now > 0 && now != old) return now;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
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

// A language model on device memory: its region and KV cache granted by the owner, its text the same
// from a replica, after a worker's SIGKILL (the held region attached) and after a park. On the
// double the engine computes from a host copy and says why; on a GPU the same path runs the GPU's
// forward pass.
TEST_F(CudaTest, ALanguageModelGeneratesOnDeviceMemoryFromReplicasParkedAndAfterACrash) {
  WriteTinyModel(models_dir_ + "/tiny");
  StartDaemon("[pool]\npark_budget = \"100MiB\"\n[[models]]\nname = \"tiny\"\npath = \"models/tiny\"\nreplicas = 2\n",
              {"--backend", "cuda"});
  auto client = Connect();
  auto registered = client->Models();
  ASSERT_TRUE(registered.ok() && registered->models_size() == 1);
  auto generate = [&] {
    v1::GenerateRequest r;
    r.set_model("tiny");
    r.set_prompt("Everyone is permitted to copy");
    r.set_max_tokens(16);
    r.set_temperature(0);
    auto reply = client->Generate(std::move(r));
    EXPECT_TRUE(reply.ok()) << reply.status().ToString();
    return reply.ok() ? reply->text() : std::string("(failed)");
  };
  const std::string first = generate();
  EXPECT_FALSE(first.empty());
  // Registration counted the device's workspace (the GPU's plan) as the engine then reported it,
  // once for each of the two replicas that hold one now.
  auto loaded = client->Models();
  ASSERT_TRUE(loaded.ok() && loaded->models_size() == 1);
  EXPECT_EQ(loaded->models(0).workspace_bytes(), 2 * registered->models(0).workspace_bytes());
  EXPECT_EQ(loaded->models(0).kv_bytes_per_token(), registered->models(0).kv_bytes_per_token());
  for (int i = 0; i < 3; i++) EXPECT_EQ(generate(), first) << "either replica";
  auto ps = client->Ps();
  ASSERT_TRUE(ps.ok() && ps->models_size() == 1);
  EXPECT_EQ(ps->models(0).replicas(), 2u);
  EXPECT_GT(ps->models(0).kv_bytes_per_token(), 0u);
  kill(client->GetStatus()->workers(ps->models(0).worker()).pid(), SIGKILL);
  WaitForIdleWorkers(*client);
  EXPECT_EQ(generate(), first) << "from the held region, attached by a respawned worker";
  ASSERT_TRUE(client->Unload("tiny", /*park=*/true).ok());
  EXPECT_EQ(generate(), first) << "from the parked copy";
  EXPECT_NE(DaemonLog().find("transformer engine: model \"tiny\": weights on the GPU, computed on the CPU from a "
                             "host copy"),
            std::string::npos)
      << "the double has no CUDA runtime to compute with, and the worker says so";
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
  EXPECT_GT(WaitForAnotherOwner(owner), 0) << "the owner is started again";
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

// Two devices with room for one of the models each: each model goes where there is room, each
// device has its own owner and workers, and one owner's death leaves the other device's model warm.
TEST_F(CudaTest, TwoDevicesEachServeTheirOwnModelsAndLoseOnlyTheirOwn) {
  launch_env_.push_back("WARMPOOL_FAKE_CUDA_DEVICES=2");
  // 3.5 MiB of weights and 3 MiB of workspace each (the weights are 4 MiB once rounded to the
  // allocation granularity): one per device.
  std::string a = MakeModel("a", "448,1024,448"), b = MakeModel("b", "448,1024,448");
  StartDaemon("[pool]\nbudget = \"10MiB\"\n", {"--backend", "cuda"});
  auto client = Connect();
  auto status = client->GetStatus();
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->devices_size(), 2);
  EXPECT_EQ(status->devices(1).name(), "warmpool CUDA test double 1");
  EXPECT_EQ(status->devices(1).budget_bytes(), 10u << 20);
  ASSERT_EQ(status->workers_size(), 4) << "workers_per_device for each device";
  EXPECT_EQ(status->workers(3).device(), 1u);
  pid_t owner0 = OwnerPid(0), owner1 = OwnerPid(1);
  ASSERT_GT(owner0, 0);
  ASSERT_GT(owner1, 0);

  client::Matrix input = RandomMatrix(3, 448, 6);
  client::Matrix expect_a = ReferenceInfer(a, input), expect_b = ReferenceInfer(b, input);
  ASSERT_TRUE(client->Load("a").ok());
  ASSERT_TRUE(client->Load("b").ok());
  auto ps = client->Ps();
  ASSERT_EQ(ps->models_size(), 2);
  EXPECT_NE(ps->models(0).device(), ps->models(1).device()) << "one model on each device";
  status = client->GetStatus();
  EXPECT_GT(status->devices(0).used_bytes(), 3u << 20);
  EXPECT_GT(status->devices(1).used_bytes(), 3u << 20);
  for (const auto& [name, expected] : {std::pair{"a", &expect_a}, std::pair{"b", &expect_b}}) {
    auto out = client->Infer(name, input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(*expected, *out);
  }
  const std::string on_device_1 = ps->models(0).device() == 1 ? ps->models(0).name() : ps->models(1).name();
  const std::string on_device_0 = on_device_1 == "a" ? "b" : "a";
  std::filesystem::remove(on_device_0 == "a" ? a : b);  // only its held weights can serve it now

  kill(owner1, SIGKILL);
  EXPECT_GT(WaitForAnotherOwner(owner1, 1), 0) << "device 1's owner is started again";
  WaitForIdleWorkers(*client);
  EXPECT_EQ(OwnerPid(0), owner0) << "device 0's owner is not touched";
  auto out = client->Infer(on_device_0, input);  // from the held weights: its file is gone
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(on_device_0 == "a" ? expect_a : expect_b, *out);
  out = client->Infer(on_device_1, input);  // loaded again from its file
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(on_device_1 == "a" ? expect_a : expect_b, *out);
  std::string log = DaemonLog();
  EXPECT_NE(log.find("the memory of device 1 is gone"), std::string::npos) << log;
  EXPECT_EQ(log.find("the memory of device 0 is gone"), std::string::npos) << log;
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

// Across a restart of warmpoold under the stand-in for systemd's store: parked copies (host memory)
// always; device weights only with [cuda] keep_across_restarts, where the double's memory, a memfd,
// outlives the owner that made it (what warmpool-driver-check lifetime asks of a real driver).
TEST_F(CudaTest, ARestartKeepsParkedCopiesAndWithKeepAcrossRestartsDeviceWeights) {
  for (bool keep : {false, true}) {
    SCOPED_TRACE(keep ? "keep_across_restarts" : "default");
    auto manager = launch::ServiceManagerDouble::Open(dir_ + (keep ? "/notify-keep" : "/notify"));
    ASSERT_TRUE(manager.ok()) << manager.status().ToString();
    service_manager_ = std::move(*manager);
    std::string a = MakeModel("a", "32,128,8");
    std::string b = MakeModel("b", "32,64,8", "relu", "f32", 2);
    std::string toml = std::string("[pool]\npark_budget = \"64MiB\"\n[cuda]\nkeep_across_restarts = ") +
                       (keep ? "true" : "false") + "\n[[models]]\nname = \"a\"\npath = \"" + a +
                       "\"\n[[models]]\nname = \"b\"\npath = \"" + b + "\"\n";
    StartDaemon(toml, {"--backend", "cuda"});
    client::Matrix input = RandomMatrix(3, 32, 4);
    client::Matrix expect_a = ReferenceInfer(a, input), expect_b = ReferenceInfer(b, input);
    {
      auto client = Connect();
      ASSERT_TRUE(client->Load("b").ok());
      ASSERT_TRUE(client->Unload("b", /*park=*/true).ok());
      ASSERT_TRUE(client->Load("a").ok());
    }
    // Until the store holds what this configuration keeps: b's copy, and a's weights with keep.
    ASSERT_TRUE(service_manager_->WaitForKept(keep ? 2u : 1u, std::chrono::seconds(4)));
    KillDaemon();
    StartDaemon(toml, {"--backend", "cuda"});
    auto client = Connect();
    std::map<std::string, std::string> states;
    auto ps = client->Ps();
    ASSERT_TRUE(ps.ok()) << ps.status().ToString();
    for (const auto& m : ps->models()) states[m.name()] = m.state();
    EXPECT_EQ(states["b"], "parked");
    EXPECT_EQ(states.count("a"), keep ? 1u : 0u) << "ps lists what is resident";
    if (keep) {
      EXPECT_EQ(states["a"], "ready");
    }
    auto out = client->Infer("a", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(expect_a, *out);
    out = client->Infer("b", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(expect_b, *out);
    const std::string log = DaemonLog();
    const size_t restart = log.rfind("received ");
    ASSERT_NE(restart, std::string::npos) << log;
    EXPECT_EQ(log.find("loading \"a\"", restart) == std::string::npos, keep) << log.substr(restart);
    EXPECT_EQ(log.find("loading \"b\"", restart), std::string::npos) << "b unparks" << log.substr(restart);
    client.reset();
    ExpectQuiescentAndValid();
    ASSERT_EQ(StopDaemon(), 0);
  }
}

}  // namespace
}  // namespace warmpool::testing
