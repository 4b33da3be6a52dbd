// warmpoold under a service manager, without systemd as PID 1: a datagram socket stands in for
// systemd's notify socket (READY after preload, watchdog pings, STOPPING), systemd-socket-activate
// passes the listening socket, SIGHUP reloads the registry and SIGTERM drains.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class ServiceTest : public DaemonTest {
 protected:
  void TearDown() override {
    if (notify_fd_ >= 0) close(notify_fd_);
    DaemonTest::TearDown();
  }

  // Binds the stand-in notify socket and passes it to the next Launch.
  void ListenForNotifications() {
    std::string path = dir_ + "/notify";
    notify_fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(notify_fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(bind(notify_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    timeval timeout{0, 100 * 1000};
    setsockopt(notify_fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    launch_env_.push_back("NOTIFY_SOCKET=" + path);
  }

  // Datagrams received until one contains `until` (included), or until the time is up.
  std::vector<std::string> Notifications(const std::string& until, std::chrono::milliseconds limit) {
    std::vector<std::string> got;
    auto end = std::chrono::steady_clock::now() + limit;
    char buffer[4096];
    while (std::chrono::steady_clock::now() < end) {
      ssize_t n = recv(notify_fd_, buffer, sizeof(buffer), 0);
      if (n <= 0) continue;
      got.emplace_back(buffer, static_cast<size_t>(n));
      if (!until.empty() && got.back().find(until) != std::string::npos) break;
    }
    return got;
  }

  static std::string Environment(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/environ");
    std::string env((std::istreambuf_iterator<char>(in)), {});
    std::replace(env.begin(), env.end(), '\0', '\n');
    return env;
  }

  // Polls `ps`-like state of one model through `models --json`.
  std::string ModelState(const std::string& name) {
    std::string out, err;
    Cli({"models", "--json"}, &out, &err);
    auto models = nlohmann::json::parse(out, nullptr, false);
    if (!models.is_array()) return "?";
    for (const auto& m : models) {
      if (m["name"] == name) return m["state"].get<std::string>();
    }
    return "absent";
  }

  bool WaitForState(const std::string& name, const std::string& state) {
    for (int i = 0; i < 200; i++) {
      if (ModelState(name) == state) return true;
      std::this_thread::sleep_for(25ms);
    }
    return false;
  }

  int notify_fd_ = -1;
};

size_t Count(const std::vector<std::string>& messages, const std::string& what) {
  size_t n = 0;
  for (const std::string& m : messages) n += m.find(what) != std::string::npos;
  return n;
}

TEST_F(ServiceTest, ReadyAfterPreloadThenWatchdogPingsThenStopping) {
  MakeModel("warm", "64,512,512,8");
  ListenForNotifications();
  launch_env_.push_back("WATCHDOG_USEC=200000");  // pings every 100 ms
  StartDaemon("[pool]\npreload = [\"warm\"]\n");

  std::vector<std::string> start = Notifications("READY=1", 10s);
  ASSERT_FALSE(start.empty());
  ASSERT_NE(start.back().find("READY=1"), std::string::npos) << ::testing::PrintToString(start);
  // The status sent with READY was computed when READY was: the preloaded model was ready then.
  EXPECT_NE(start.back().find("1 ready, 0 loading"), std::string::npos) << start.back();

  std::vector<std::string> running = Notifications("", 1500ms);
  EXPECT_GE(Count(running, "WATCHDOG=1"), 5u) << ::testing::PrintToString(running);
  EXPECT_EQ(Count(running, "READY=1"), 0u);

  // Only the supervisor speaks for the service: workers inherit none of its variables.
  for (pid_t worker : WorkerPids()) {
    std::string env = Environment(worker);
    EXPECT_EQ(env.find("NOTIFY_SOCKET="), std::string::npos) << env;
    EXPECT_EQ(env.find("WATCHDOG_"), std::string::npos) << env;
  }

  EXPECT_EQ(StopDaemon(), 0) << DaemonLog();
  std::vector<std::string> stop = Notifications("STOPPING=1", 2s);
  EXPECT_EQ(Count(stop, "STOPPING=1"), 1u) << ::testing::PrintToString(stop);
}

TEST_F(ServiceTest, LogsCarrySyslogPrioritiesWhenStderrIsTheJournal) {
  MakeModel("m", "8,4");
  // systemd tells a service that stderr is the journal by naming that stream's device and inode.
  std::string log = dir_ + "/daemon.log";
  std::ofstream(log).close();
  struct stat st{};
  ASSERT_EQ(stat(log.c_str(), &st), 0);
  launch_env_.push_back(fmt::format("JOURNAL_STREAM={}:{}", st.st_dev, st.st_ino));
  StartDaemon("[[models]]\nname = \"bad\"\nengine = \"nonesuch\"\n");
  std::string out;
  EXPECT_EQ(Cli({"infer", "m", "--random", "1"}, &out), 0);
  std::string text = DaemonLog();
  EXPECT_NE(text.find("<6>warmpoold: warmpoold "), std::string::npos) << text;  // info
  EXPECT_NE(text.find("<4>warmpoold: model \"bad\""), std::string::npos) << text;  // warning
  // No timestamps: the journal has its own.
  EXPECT_EQ(text.find("\n20"), std::string::npos) << text;
}

TEST_F(ServiceTest, SocketActivationServesOnThePassedSocket) {
  const std::string activate = "/usr/bin/systemd-socket-activate";
  ASSERT_TRUE(fs::exists(activate)) << "systemd-socket-activate is part of the systemd package";
  std::string model = MakeModel("m", "8,4");
  std::ofstream(dir_ + "/config.toml") << "[daemon]\nworkers_per_device = 2\n";
  // The activator binds the socket and execs warmpoold on the first connection (Launch's probe),
  // with LISTEN_FDS=1; warmpoold is told no --socket at all.
  LaunchCommand({activate, "-l", socket_, BinDir() + "/warmpoold", "--config",
                 dir_ + "/config.toml", "--instance", instance_, "--models-dir", models_dir_});
  EXPECT_NE(DaemonLog().find("(socket activation)"), std::string::npos) << DaemonLog();

  auto c = Connect();
  ASSERT_NE(c, nullptr);
  client::Matrix input = RandomMatrix(3, 8, 7);
  auto out = c->Infer("m", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(ReferenceInfer(model, input), *out);
  for (pid_t worker : WorkerPids()) {
    EXPECT_EQ(Environment(worker).find("LISTEN_"), std::string::npos) << Environment(worker);
  }
  c.reset();

  ExpectQuiescentAndValid();
  EXPECT_EQ(StopDaemon(), 0) << DaemonLog();
  // The socket file belongs to whoever bound it: the daemon leaves it.
  EXPECT_TRUE(fs::exists(socket_));
  fs::remove(socket_);
}

TEST_F(ServiceTest, SighupAppliesAddedChangedAndRemovedModels) {
  std::string keep = MakeModel("keep", "8,16,4");
  MakeModel("gone", "8,4", "relu", "f32", 2);
  fs::create_directories(dir_ + "/v1");
  fs::create_directories(dir_ + "/v2");
  std::string v1 = dir_ + "/v1/change.safetensors";
  std::string v2 = dir_ + "/v2/change.safetensors";
  ASSERT_EQ(RunProgram({BinDir() + "/warmpool-mkmodel", v1, "--layers", "8,4", "--seed", "3"}), 0);
  ASSERT_EQ(RunProgram({BinDir() + "/warmpool-mkmodel", v2, "--layers", "8,4", "--seed", "4"}), 0);
  StartDaemon("[[models]]\nname = \"change\"\npath = \"v1/change.safetensors\"\n",
              {"--enable-fault-injection"});
  for (const char* m : {"keep", "gone", "change"}) ASSERT_EQ(Cli({"load", m}), 0) << m;
  client::Matrix input = RandomMatrix(2, 8, 11);

  // Work in flight on the model about to be removed.
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:800", "--model", "gone"}), 0);
  auto busy = Connect();
  ASSERT_NE(busy, nullptr);
  auto slow_id = SendInfer(*busy, "gone", input);
  ASSERT_TRUE(slow_id.ok());
  std::this_thread::sleep_for(200ms);

  // The new registry: "change" points at v2, "gone" is deleted, "fresh" appears.
  std::ofstream(dir_ + "/config.toml") << "[daemon]\nworkers_per_device = 2\n"
                                       << "[[models]]\nname = \"change\"\npath = \"v2/change.safetensors\"\n";
  fs::remove(models_dir_ + "/gone.safetensors");
  std::string fresh = MakeModel("fresh", "8,2");
  ASSERT_EQ(kill(DaemonPid(), SIGHUP), 0);

  // Removed: its accepted work still finishes, new requests get NOT_FOUND, then it is gone.
  auto reply = busy->Wait(*slow_id);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_TRUE(reply->has_infer_reply()) << reply->DebugString();
  EXPECT_TRUE(WaitForState("gone", "absent")) << ModelState("gone");
  auto c = Connect();
  auto refused = c->Infer("gone", input);
  EXPECT_EQ(refused.status().code(), Code::kNotFound) << refused.status().ToString();

  // Changed: the next request is served by the new file.
  auto changed = c->Infer("change", input);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  ExpectNear(ReferenceInfer(v2, input), *changed);
  // Added.
  auto added = c->Infer("fresh", input);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  ExpectNear(ReferenceInfer(fresh, input), *added);
  // Unchanged and loaded: kept serving, never unloaded.
  EXPECT_EQ(ModelState("keep"), "ready");
  EXPECT_EQ(DaemonLog().find("\"keep\" ready on worker", DaemonLog().find("SIGHUP")),
            std::string::npos)
      << "keep was reloaded:\n" << DaemonLog();
  auto kept = c->Infer("keep", input);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  ExpectNear(ReferenceInfer(keep, input), *kept);
  EXPECT_NE(DaemonLog().find("reload: 1 model(s) added, 1 changed, 1 removed"), std::string::npos)
      << DaemonLog();
}

TEST_F(ServiceTest, AModelRemovedByReloadWhoseWorkerCrashesStillAnswersItsRequest) {
  fs::create_directories(dir_ + "/v1");
  std::string path = dir_ + "/v1/gone.safetensors";
  ASSERT_EQ(RunProgram({BinDir() + "/warmpool-mkmodel", path, "--layers", "8,4"}), 0);
  StartDaemon("[[models]]\nname = \"gone\"\npath = \"v1/gone.safetensors\"\n",
              {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "gone"}), 0);
  // In the worker: a pause (the reload lands in it), then the worker dies before it answers.
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:600", "--model", "gone"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.before_restore", "kill", "--model", "gone"}), 0);
  auto c = Connect();
  client::Matrix input = RandomMatrix(2, 8, 4);
  auto id = SendInfer(*c, "gone", input);
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(200ms);
  std::ofstream(dir_ + "/config.toml") << "[daemon]\nworkers_per_device = 2\n";
  client::Matrix expected = ReferenceInfer(path, input);
  fs::remove(path);  // gone with the registration: only the weights the supervisor holds remain
  ASSERT_EQ(kill(DaemonPid(), SIGHUP), 0);
  // The request was accepted before the reload: it is retried on the held weights and answered.
  ExpectInferReply(c->Wait(*id), expected);
  EXPECT_TRUE(WaitForState("gone", "absent")) << ModelState("gone");
  EXPECT_EQ(c->Infer("gone", input).status().code(), Code::kNotFound);
}

TEST_F(ServiceTest, SighupWithABrokenConfigKeepsTheRegistry) {
  MakeModel("m", "8,4");
  StartDaemon();
  std::ofstream(dir_ + "/config.toml") << "[daemon\nbroken";
  ASSERT_EQ(kill(DaemonPid(), SIGHUP), 0);
  for (int i = 0; i < 100 && DaemonLog().find("reload refused") == std::string::npos; i++) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(DaemonLog().find("reload refused, the registry is unchanged"), std::string::npos)
      << DaemonLog();
  EXPECT_EQ(Cli({"infer", "m", "--random", "1"}), 0);
}

TEST_F(ServiceTest, SigtermDrainsRequestsInFlightAndRefusesNewOnes) {
  std::string model = MakeModel("m", "8,4");
  StartDaemon("", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:1000", "--model", "m"}), 0);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  client::Matrix input = RandomMatrix(2, 8, 5);
  auto id = SendInfer(*c, "m", input);
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(200ms);  // in the worker, inside the delay

  ASSERT_EQ(kill(DaemonPid(), SIGTERM), 0);
  // The listening socket goes at once: nobody new gets in while the drain runs.
  bool refused = false;
  for (int i = 0; i < 100 && !refused; i++) {
    refused = !client::Client::Connect(socket_).ok();
    if (!refused) std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(refused);
  ExpectInferReply(c->Wait(*id), ReferenceInfer(model, input));
  EXPECT_EQ(WaitForExit(), 0) << DaemonLog();
  EXPECT_NE(DaemonLog().find("drain ended by every request answered"), std::string::npos)
      << DaemonLog();
}

TEST_F(ServiceTest, TheDrainStillAdmitsRequestsThatWaitForRoom) {
  std::string a = MakeModel("a", "8,4");
  std::string b = MakeModel("b", "8,4", "relu", "f32", 2);
  StartDaemon("[pool]\ncapacity = 1\n", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "a"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "delay:800", "--model", "a"}), 0);
  auto c = Connect();
  client::Matrix input = RandomMatrix(1, 8, 2);
  auto id_a = SendInfer(*c, "a", input);
  std::this_thread::sleep_for(150ms);
  auto id_b = SendInfer(*c, "b", input);  // needs a's room, which a's request holds
  ASSERT_TRUE(id_a.ok() && id_b.ok());
  std::this_thread::sleep_for(100ms);
  ASSERT_EQ(kill(DaemonPid(), SIGTERM), 0);
  ExpectInferReply(c->Wait(*id_a), ReferenceInfer(a, input));
  ExpectInferReply(c->Wait(*id_b), ReferenceInfer(b, input));
  EXPECT_EQ(WaitForExit(), 0) << DaemonLog();
  EXPECT_NE(DaemonLog().find("drain ended by every request answered"), std::string::npos)
      << DaemonLog();
}

TEST_F(ServiceTest, DrainIsBoundedThenRequestsAreAnsweredUnavailable) {
  MakeModel("m", "8,4");
  StartDaemon("drain_timeout_ms = 300\nstop_kill_ms = 500\n", {"--enable-fault-injection"});
  ASSERT_EQ(Cli({"load", "m"}), 0);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "hang", "--model", "m"}), 0);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto id = SendInfer(*c, "m", RandomMatrix(1, 8, 5), /*deadline_ms=*/60000);
  ASSERT_TRUE(id.ok());
  std::this_thread::sleep_for(200ms);
  // Waits for the hung request's model, so for the end of the drain.
  auto unload_id = c->Send(client::UnloadAllRequest());
  ASSERT_TRUE(unload_id.ok());
  std::this_thread::sleep_for(50ms);
  ASSERT_EQ(kill(DaemonPid(), SIGTERM), 0);
  auto reply = c->Wait(*id);
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_TRUE(reply->has_error()) << reply->DebugString();
  EXPECT_EQ(reply->error().code(), v1::UNAVAILABLE) << reply->DebugString();
  auto unloaded = c->Wait(*unload_id);
  ASSERT_TRUE(unloaded.ok()) << unloaded.status().ToString();
  EXPECT_EQ(unloaded->error().code(), v1::UNAVAILABLE) << unloaded->DebugString();
  EXPECT_EQ(WaitForExit(), 0) << DaemonLog();
  EXPECT_NE(DaemonLog().find("drain ended by the drain timeout (2 requests answered UNAVAILABLE)"),
            std::string::npos)
      << DaemonLog();
}

}  // namespace
}  // namespace warmpool::testing
