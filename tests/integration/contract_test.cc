// What users are promised at the edges: usage errors exit 2, replies as large as the daemon allows
// arrive, models the index has no room for are listed with why, the segment shows what each worker
// holds, a one-shot fault fires exactly once, a file replaced on disk is served consistently, and
// models spread over the workers.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "shm/model_index.h"
#include "shm/segment.h"
#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

class ContractTest : public DaemonTest {
 protected:
  json CliJson(const std::vector<std::string>& args) {
    std::string out, err;
    EXPECT_EQ(Cli(args, &out, &err), 0) << err;
    return json::parse(out, nullptr, false);
  }
  // Waits until `warmpool status` shows every worker up and idle, and no restarts pending.
  json SettledStatus() {
    json status;
    for (int i = 0; i < 200; i++) {
      status = CliJson({"status", "--json"});
      bool settled = status["inflight"] == 0 && status["queued"] == 0;
      for (const auto& w : status["workers"]) settled = settled && w["state"] == "idle";
      if (settled) break;
      std::this_thread::sleep_for(20ms);
    }
    return status;
  }
};

TEST_F(ContractTest, UsageErrorsExitTwo) {
  std::string out, err;
  EXPECT_EQ(Cli({"infer", "m", "--random", "0"}, &out, &err), 2) << err;
  EXPECT_EQ(Cli({"--bogus"}, &out, &err), 2) << err;
  EXPECT_EQ(Cli({"load"}, &out, &err), 2) << "MODEL is required: " << err;
  EXPECT_EQ(Cli({"--help"}, &out, &err), 0) << err;
  EXPECT_EQ(RunProgram({BinDir() + "/warmpoold", "--bogus"}, &out, &err), 2) << err;
  EXPECT_EQ(RunProgram({BinDir() + "/warmpoold", "--backend", "tpu"}, &out, &err), 2) << err;
  EXPECT_EQ(RunProgram({BinDir() + "/warmpool-sim", "--bogus"}, &out, &err), 2) << err;
}

TEST_F(ContractTest, ValuesOutsideFloatRangeAreInvalidArgument) {
  MakeModel("m", "2,2");
  StartDaemon();
  std::string out, err;
  EXPECT_EQ(Cli({"infer", "m", "--input", "-"}, &out, &err, "[[1e39, 0]]"), 2);
  EXPECT_TRUE(Contains(err, "INVALID_ARGUMENT")) << err;
  EXPECT_TRUE(Contains(err, "outside the range of f32")) << err;
  EXPECT_EQ(Cli({"infer", "m", "--input", "-"}, &out, &err, "[[-3.4e38, 3.4e38]]"), 0) << err;
}

TEST_F(ContractTest, RepliesAsLargeAsTheDaemonAllowsArrive) {
  MakeModel("wide", "8,4096");
  StartDaemon("[limits]\nmax_frame_bytes = \"128MiB\"\n");
  auto c = Connect();  // the library's defaults, as the CLI uses them
  auto out = c->Infer("wide", RandomMatrix(4200, 8, 1));  // 4200 x 4096 x 4 bytes: over 64 MiB
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->rows, 4200u);
  EXPECT_EQ(out->cols, 4096u);
}

TEST_F(ContractTest, ModelsBeyondMaxModelsAreListedAsRefusedWithTheReason) {
  MakeModel("a", "8,4");
  MakeModel("b", "8,4");
  MakeModel("c", "8,4");
  StartDaemon("[limits]\nmax_models = 2\n");
  json models = CliJson({"models", "--json"});
  json refused;
  for (const auto& m : models) {
    if (m["state"] == "refused") refused = m;
  }
  ASSERT_FALSE(refused.is_null()) << models.dump();
  EXPECT_EQ(refused["name"], "c");
  EXPECT_TRUE(Contains(refused["error"].get<std::string>(), "max_models")) << refused.dump();
  auto c = Connect();
  auto out = c->Infer("c", RandomMatrix(1, 8, 1));
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kResourceExhausted) << out.status().ToString();
  EXPECT_TRUE(Contains(out.status().message(), "max_models")) << out.status().ToString();
  EXPECT_TRUE(c->Infer("a", RandomMatrix(1, 8, 2)).ok());
}

TEST_F(ContractTest, WorkerRecordsShowTheModelsEachHoldsAndWhetherItIsBusy) {
  MakeModel("a", "8,4");
  MakeModel("b", "8,4");
  StartDaemon();
  auto c = Connect();
  ASSERT_TRUE(c->Load("a").ok());
  ASSERT_TRUE(c->Load("b").ok());
  json status = SettledStatus();
  std::set<std::string> held;
  for (const auto& w : status["workers"]) {
    ASSERT_EQ(w["models"].size(), 1u) << "one model on each worker: " << status.dump();
    held.insert(w["models"][0].get<std::string>());
    EXPECT_EQ(w["outstanding"], 0);
  }
  EXPECT_EQ(held, (std::set<std::string>{"a", "b"}));
  // The same, read from the segment as any observer would.
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  std::set<std::string> from_segment;
  for (uint32_t slot = 0; slot < 2; slot++) {
    const shm::WorkerRecord& w = segment->view().worker(slot);
    EXPECT_EQ(w.state, static_cast<uint32_t>(shm::WorkerState::kIdle));
    ASSERT_EQ(w.models, 1u);
    from_segment.insert(segment->view().model(w.held[0]).name);
    EXPECT_EQ(w.held[1], shm::kNil);
    EXPECT_GE(w.served, 1u);
  }
  EXPECT_EQ(from_segment, held);
}

TEST_F(ContractTest, AOneShotFaultFiresExactlyOnceEvenWhenItsRequestIsRetried) {
  std::string path = MakeModel("m", "8,16,4");
  StartDaemon("[recovery]\nrespawn_min_ms = 10\ncrash_loop_crashes = 100\n"
              "[[models]]\nname = \"m\"\npath = \"models/m.safetensors\"\nreplicas = 2\n",
              {"--enable-fault-injection"});
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  client::Matrix input = RandomMatrix(2, 8, 7);
  client::Matrix expected = ReferenceInfer(path, input);
  for (int round = 0; round < 10; round++) {
    SettledStatus();
    ASSERT_EQ(Cli({"fault", "arm", "infer.after_take", "kill", "--model", "m"}), 0);
    // Several requests at once: the retried one races the others for a second shot, and must
    // not get one.
    std::vector<uint64_t> ids;
    for (int i = 0; i < 4; i++) ids.push_back(*SendInfer(*c, "m", input));
    for (uint64_t id : ids) ExpectInferReply(c->Wait(id), expected);
    std::string out;
    ASSERT_EQ(Cli({"fault", "clear"}, &out), 0);
    EXPECT_TRUE(Contains(out, "0 fault(s) cleared")) << "round " << round << ": " << out;
  }
  json status = SettledStatus();
  uint32_t restarts = 0;
  for (const auto& w : status["workers"]) restarts += w["restarts"].get<uint32_t>();
  EXPECT_EQ(restarts, 10u) << "one worker killed per round";
}

TEST_F(ContractTest, AFileReplacedOnDiskBeforeItsLoadIsServedByItsOwnDescription) {
  // Registered as relu, replaced by a tanh model of the same shapes before the first load: the
  // header kept from registration describes other weights than the file now holds.
  MakeModel("m", "8,32,4", "relu", "f32", 1);
  StartDaemon("[pool]\npark_budget = \"64MiB\"\n"
              "[[models]]\nname = \"m\"\npath = \"models/m.safetensors\"\nreplicas = 2\n");
  std::string path = MakeModel("m", "8,32,4", "tanh", "f32", 2);
  client::Matrix input = RandomMatrix(3, 8, 9);
  client::Matrix expected = ReferenceInfer(path, input);
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  auto all_correct = [&](const std::string& when) {
    std::vector<uint64_t> ids;
    for (int i = 0; i < 16; i++) ids.push_back(*SendInfer(*c, "m", input));  // both replicas serve
    for (uint64_t id : ids) {
      SCOPED_TRACE(when);
      ExpectInferReply(c->Wait(id), expected);
    }
  };
  for (int i = 0; i < 100; i++) {
    json ps = CliJson({"ps", "--json"});
    if (!ps.empty() && ps[0]["replicas"] == 2) break;
    std::this_thread::sleep_for(10ms);
  }
  all_correct("two replicas");
  kill(WorkerPids()[0], SIGKILL);  // re-attach from the held weights
  all_correct("after a worker died");
  ASSERT_EQ(Cli({"unload", "--park", "m"}), 0);
  all_correct("after park and unpark");
}

TEST_F(ContractTest, TwoPreloadedModelsSpreadOverTheWorkers) {
  MakeModel("a", "8,4");
  MakeModel("b", "8,4");
  StartDaemon("[pool]\npreload = [\"a\", \"b\"]\n");
  std::set<std::string> layout;
  for (int i = 0; i < 200; i++) {
    json status = CliJson({"status", "--json"});
    layout.clear();
    bool spread = true;
    for (const auto& w : status["workers"]) {
      spread = spread && w["models"].size() == 1;
      for (const auto& m : w["models"]) layout.insert(m.get<std::string>());
    }
    if (spread && layout.size() == 2) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(layout, (std::set<std::string>{"a", "b"})) << "one model on each worker";
  json status = CliJson({"status", "--json"});
  for (const auto& w : status["workers"]) EXPECT_EQ(w["models"].size(), 1u) << status.dump();
}

}  // namespace
}  // namespace warmpool::testing
