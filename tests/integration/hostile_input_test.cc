// Hostile input that is not malformed bytes (faults_test.cc has those): paths leading out of the
// model roots, files that are not files, limits pushed by one client. Each gets a typed error and
// the daemon keeps serving everybody else.
#include <signal.h>
#include <sys/stat.h>
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

class HostileInputTest : public DaemonTest {
 protected:
  // name -> {state, error} from `warmpool models --json`.
  std::map<std::string, std::pair<std::string, std::string>> Models() {
    std::string out, err;
    EXPECT_EQ(Cli({"models", "--json"}, &out, &err), 0) << err;
    std::map<std::string, std::pair<std::string, std::string>> models;
    auto json = nlohmann::json::parse(out, nullptr, false);
    if (!json.is_array()) return models;
    for (const auto& m : json) {
      models[m["name"]] = {m["state"], m["error"].is_string() ? m["error"].get<std::string>() : ""};
    }
    return models;
  }

  // A valid model outside the models directory and outside the config's directory.
  std::string OutsideModel(const std::string& name) {
    outside_ = fs::temp_directory_path() / ("warmpool-outside-" + std::to_string(getpid()));
    fs::create_directories(outside_);
    std::string path = outside_ + "/" + name + ".safetensors";
    EXPECT_EQ(RunProgram({BinDir() + "/warmpool-mkmodel", path, "--layers", "8,4"}), 0);
    return path;
  }

  void TearDown() override {
    DaemonTest::TearDown();
    std::error_code ec;
    if (!outside_.empty()) fs::remove_all(outside_, ec);
  }

  std::string outside_;
};

TEST_F(HostileInputTest, PathsOutsideTheModelRootsAreNeverRegisteredOrRead) {
  std::string outside = OutsideModel("x");
  MakeModel("fine", "8,4");
  // A symlink in the models directory leading out, and a `..` path in the configuration.
  fs::create_symlink(outside, models_dir_ + "/escape.safetensors");
  std::string dotdot = models_dir_ + "/../../" + fs::path(outside).parent_path().filename().string() +
                       "/x.safetensors";
  StartDaemon(fmt::format("[access]\nmodel_roots = [\"{}\"]\n[[models]]\nname = \"dotdot\"\npath = "
                          "\"{}\"\n[[models]]\nname = \"absolute\"\npath = \"{}\"\n",
                          models_dir_, dotdot, outside));
  auto models = Models();
  for (const char* name : {"escape", "dotdot", "absolute"}) {
    ASSERT_TRUE(models.count(name)) << name;
    EXPECT_EQ(models[name].first, "failed") << name;
    EXPECT_NE(models[name].second.find("outside the model roots"), std::string::npos)
        << name << ": " << models[name].second;
  }
  std::string out, err;
  EXPECT_EQ(Cli({"load", "escape"}, &out, &err), 1);
  EXPECT_NE(err.find("outside the model roots"), std::string::npos) << err;
  EXPECT_EQ(Cli({"infer", "fine", "--random", "2"}, &out, &err), 0) << err;
}

TEST_F(HostileInputTest, AFifoOrSymlinkSwappedInAfterRegistrationIsNeverOpened) {
  MakeModel("good", "8,4");
  std::string outside = OutsideModel("x");
  std::ofstream(models_dir_ + "/bad.safetensors") << "garbage: registered as failed";
  std::ofstream(models_dir_ + "/worse.safetensors") << "garbage: registered as failed";
  StartDaemon("[recovery]\nfailed_cooldown_ms = 100\n");
  // Swapped in after registration: a FIFO (whose open would block) and a symlink leading out.
  fs::remove(models_dir_ + "/bad.safetensors");
  ASSERT_EQ(mkfifo((models_dir_ + "/bad.safetensors").c_str(), 0600), 0);
  fs::remove(models_dir_ + "/worse.safetensors");
  fs::create_symlink(outside, models_dir_ + "/worse.safetensors");
  std::this_thread::sleep_for(300ms);  // past the cooldown: the next request looks again
  auto c = Connect();
  client::Matrix input = RandomMatrix(1, 8, 1);
  auto bad = c->Infer("bad", input);
  EXPECT_EQ(bad.status().code(), Code::kFailedPrecondition) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("neither a regular file nor a directory"), std::string::npos)
      << bad.status().ToString();
  auto worse = c->Infer("worse", input);
  EXPECT_EQ(worse.status().code(), Code::kFailedPrecondition) << worse.status().ToString();
  EXPECT_NE(worse.status().message().find("outside the model roots"), std::string::npos)
      << worse.status().ToString();
  EXPECT_TRUE(c->GetStatus().ok());
  EXPECT_TRUE(c->Infer("good", input).ok());
}

TEST_F(HostileInputTest, FileNamesThatAreNotModelNamesAreSkipped) {
  std::string good = MakeModel("good", "8,4");
  // Not UTF-8, and not a model name: registered even as failed, it would put bytes that no
  // protobuf string may hold into every models/ps/status reply.
  fs::copy_file(good, models_dir_ + "/caf\xe9.safetensors");
  fs::copy_file(good, models_dir_ + "/.hidden.safetensors");
  StartDaemon();
  auto models = Models();
  EXPECT_EQ(models.size(), 1u);
  EXPECT_TRUE(models.count("good"));
  EXPECT_NE(DaemonLog().find("caf?.safetensors skipped: its file name is not a model name"),
            std::string::npos)
      << DaemonLog();
  auto c = Connect();
  EXPECT_TRUE(c->GetStatus().ok());
  EXPECT_TRUE(c->Ps().ok());
}

TEST_F(HostileInputTest, RegisterChecksTheRootsAndTheFile) {
  std::string outside = OutsideModel("x");
  std::string inside = MakeModel("seed", "8,4");
  StartDaemon();
  std::string out, err;
  // Outside the roots, directly and through a symlink inside them.
  EXPECT_EQ(Cli({"register", "r", outside}, &out, &err), 1);
  EXPECT_NE(err.find("PERMISSION_DENIED"), std::string::npos) << err;
  fs::create_symlink(outside, models_dir_ + "/link.bin");
  EXPECT_EQ(Cli({"register", "r", models_dir_ + "/link.bin"}, &out, &err), 1);
  EXPECT_NE(err.find("outside the model roots"), std::string::npos) << err;
  // Not a regular file: a FIFO would block whoever opens it; a directory without a config.json is
  // no model.
  ASSERT_EQ(mkfifo((models_dir_ + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(Cli({"register", "r", models_dir_ + "/fifo"}, &out, &err), 2);
  EXPECT_NE(err.find("INVALID_ARGUMENT"), std::string::npos) << err;
  EXPECT_EQ(Cli({"register", "r", models_dir_}, &out, &err), 2);
  EXPECT_NE(err.find("config.json"), std::string::npos) << err;
  // Garbage inside the roots: refused, not registered as failed.
  std::ofstream(models_dir_ + "/garbage.bin") << "not a safetensors file at all";
  EXPECT_EQ(Cli({"register", "r", models_dir_ + "/garbage.bin"}, &out, &err), 2) << err;
  EXPECT_FALSE(Models().count("r"));
  // Bad names, a name the configuration owns.
  EXPECT_EQ(Cli({"register", "../etc", inside}, &out, &err), 2);
  EXPECT_EQ(Cli({"register", "seed", inside}, &out, &err), 1);
  EXPECT_NE(err.find("FAILED_PRECONDITION"), std::string::npos) << err;

  // A good one serves, then goes.
  fs::copy_file(inside, models_dir_ + "/copy.bin");
  ASSERT_EQ(Cli({"register", "r", models_dir_ + "/copy.bin"}, &out, &err), 0) << err;
  EXPECT_NE(out.find("r registered from"), std::string::npos) << out;
  client::Matrix input = RandomMatrix(2, 8, 3);
  auto c = Connect();
  auto result = c->Infer("r", input);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ExpectNear(ReferenceInfer(inside, input), *result);
  ASSERT_EQ(Cli({"register", "r", "--remove"}, &out, &err), 0) << err;
  for (int i = 0; i < 200 && Models().count("r"); i++) std::this_thread::sleep_for(25ms);
  EXPECT_FALSE(Models().count("r"));
  EXPECT_EQ(c->Infer("r", input).status().code(), Code::kNotFound);
  EXPECT_TRUE(c->Infer("seed", input).ok());
}

// The roots a reload sets are the ones `register` checks from then on (the shell resolves paths
// with the same settings as the core).
TEST_F(HostileInputTest, RegisterFollowsTheModelRootsOfTheLastReload) {
  std::string outside = OutsideModel("x");
  StartDaemon();
  std::string out, err;
  EXPECT_EQ(Cli({"register", "r", outside}, &out, &err), 1);
  EXPECT_NE(err.find("PERMISSION_DENIED"), std::string::npos) << err;
  {
    std::ofstream config(dir_ + "/config.toml");
    config << fmt::format("[daemon]\nworkers_per_device = 2\n[access]\nmodel_roots = [\"{}\", \"{}\"]\n",
                          models_dir_, outside_);
  }
  ASSERT_EQ(kill(DaemonPid(), SIGHUP), 0);
  for (int i = 0; i < 200 && DaemonLog().find("reload: ") == std::string::npos; i++) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(Cli({"register", "r", outside}, &out, &err), 0) << err;
  client::Matrix input = RandomMatrix(1, 8, 5);
  auto result = Connect()->Infer("r", input);
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  ExpectNear(ReferenceInfer(outside, input), *result);
}

TEST_F(HostileInputTest, OneConnectionOverItsRequestLimitDoesNotDisturbOthers) {
  std::string model = MakeModel("m", "8,4");
  StartDaemon("[limits]\nmax_requests_per_connection = 2\n", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:500", "--model", "m", "--times", "2"}), 0);
  auto greedy = Connect();
  ASSERT_NE(greedy, nullptr);
  client::Matrix input = RandomMatrix(1, 8, 9);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 5; i++) {
    auto id = SendInfer(*greedy, "m", input);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  // Somebody else meanwhile.
  auto other = Connect();
  auto theirs = other->Infer("m", input);
  ASSERT_TRUE(theirs.ok()) << theirs.status().ToString();
  int ok = 0, refused = 0;
  for (uint64_t id : ids) {
    auto reply = greedy->Wait(id);
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    if (reply->has_infer_reply()) {
      ok++;
    } else {
      EXPECT_EQ(reply->error().code(), v1::RESOURCE_EXHAUSTED) << reply->DebugString();
      EXPECT_NE(reply->error().message().find("max_requests_per_connection"), std::string::npos);
      refused++;
    }
  }
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(refused, 3);
  // Answered ones free their places again.
  auto again = greedy->Infer("m", input);
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(HostileInputTest, ConnectionsOverTheLimitAreToldWhyAndOthersKeepServing) {
  MakeModel("m", "8,4");
  StartDaemon("[limits]\nmax_connections = 3\nmax_connections_per_peer = 3\n");  // one user: all
  std::vector<std::unique_ptr<client::Client>> held;
  for (int i = 0; i < 3; i++) {
    held.push_back(Connect());
    ASSERT_NE(held.back(), nullptr);
    ASSERT_TRUE(held.back()->GetStatus().ok());  // accepted and counted
  }
  auto extra = client::Client::Connect(socket_);
  ASSERT_TRUE(extra.ok());  // the kernel accepts; the daemon answers and closes
  auto refused = (*extra)->GetStatus();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("too many connections"), std::string::npos)
      << refused.status().ToString();
  EXPECT_TRUE(held[0]->Infer("m", RandomMatrix(1, 8, 1)).ok());
  held.pop_back();
  // A place freed is a place taken again (the close reaches the daemon asynchronously).
  bool served = false;
  for (int i = 0; i < 100 && !served; i++) {
    auto c = client::Client::Connect(socket_);
    served = c.ok() && (*c)->GetStatus().ok();
    if (!served) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(served);
}

}  // namespace
}  // namespace warmpool::testing
