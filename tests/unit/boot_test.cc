// The start-up checks (supervisor/boot.h), `warmpoold --check`, the listen addresses and the
// takeover's decision (supervisor/takeover.h), without a daemon: each refusal is typed and says
// what to do.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "supervisor/boot.h"
#include "supervisor/listen_address.h"
#include "supervisor/takeover.h"

namespace warmpool::supervisor {
namespace {

namespace fs = std::filesystem;

class BootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warmpool-boot-XXXXXX";
    dir_ = mkdtemp(tmpl);
    worker_ = dir_ + "/warmpool-worker";
    Write(worker_, "#!/bin/sh\n");
    chmod(worker_.c_str(), 0755);
    config_.socket_path = dir_ + "/warmpool.sock";
    config_.models_dir = dir_ + "/models";
    fs::create_directory(config_.models_dir);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
  std::string RunCheckText(int* rc) {
    std::FILE* out = std::tmpfile();
    *rc = RunCheck(config_, worker_, out);
    std::rewind(out);
    std::string text;
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), out)) > 0;) text.append(buffer, n);
    std::fclose(out);
    return text;
  }

  std::string dir_, worker_;
  Config config_;
};

TEST_F(BootTest, AValidConfigurationPassesAndSaysWhatItWouldServe) {
  Write(config_.models_dir + "/broken.safetensors", "not a safetensors header");
  Result<BootPlan> plan = CheckBoot(config_, worker_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->owner_path, dir_ + "/warmpool-owner");
  int rc = -1;
  const std::string text = RunCheckText(&rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("is valid"), std::string::npos) << text;
  EXPECT_NE(text.find("socket " + config_.socket_path), std::string::npos) << text;
  // A broken file registers as failed: listed, and no reason not to start.
  EXPECT_NE(text.find("1 models, 1 of them would register as failed"), std::string::npos) << text;
  EXPECT_NE(text.find("broken"), std::string::npos) << text;
}

TEST_F(BootTest, EachStartUpCheckFailsWithWhatToDo) {
  struct Case {
    const char* what;
    std::function<void(Config&, std::string&)> spoil;
    Code code;
    const char* says;
  };
  const std::string long_path = "/tmp/" + std::string(120, 's') + ".sock";
  const std::vector<Case> cases = {
      {"no worker", [](Config&, std::string& w) { w += ".missing"; }, Code::kFailedPrecondition, "pass --worker"},
      {"no such group", [](Config& c, std::string&) { c.admin_group = "no-such-group-here"; },
       Code::kFailedPrecondition, "groupadd no-such-group-here"},
      {"token file missing", [this](Config& c, std::string&) { c.http_admin_token_file = dir_ + "/none"; },
       Code::kFailedPrecondition, "admin_token_file"},
      {"socket path too long", [&](Config& c, std::string&) { c.socket_path = long_path; },
       Code::kInvalidArgument, "longer than"},
      {"socket directory missing", [this](Config& c, std::string&) { c.socket_path = dir_ + "/no/such.sock"; },
       Code::kFailedPrecondition, "create it or pass --socket"},
      {"not loopback", [](Config& c, std::string&) { c.http_listen = "0.0.0.0:9464"; },
       Code::kInvalidArgument, "not a loopback address"},
      {"not HOST:PORT", [](Config& c, std::string&) { c.http_listen = "127.0.0.1:99999"; },
       Code::kInvalidArgument, "is not HOST:PORT"},
  };
  for (const Case& c : cases) {
    Config config = config_;
    std::string worker = worker_;
    c.spoil(config, worker);
    Result<BootPlan> plan = CheckBoot(config, worker);
    ASSERT_FALSE(plan.ok()) << c.what;
    EXPECT_EQ(plan.status().code(), c.code) << c.what << ": " << plan.status().ToString();
    EXPECT_NE(plan.status().message().find(c.says), std::string::npos) << c.what << ": " << plan.status().ToString();
  }
  config_.http_listen = "[::2]:80";
  int rc = -1;
  const std::string text = RunCheckText(&rc);
  EXPECT_EQ(rc, 1) << text;
  EXPECT_NE(text.find("would not start: [http] listen \"[::2]:80\" is not a loopback address"), std::string::npos) << text;
}

TEST_F(BootTest, ATokenFileReadableByOthersOrTooShortIsRefused) {
  const std::string token = dir_ + "/token";
  Write(token, "short\n");
  chmod(token.c_str(), 0600);
  config_.http_admin_token_file = token;
  Result<BootPlan> plan = CheckBoot(config_, worker_);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("at least 16"), std::string::npos) << plan.status().ToString();
  Write(token, "0123456789abcdef0123\n");
  chmod(token.c_str(), 0644);
  plan = CheckBoot(config_, worker_);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("chmod 600"), std::string::npos) << plan.status().ToString();
  chmod(token.c_str(), 0600);
  plan = CheckBoot(config_, worker_);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->admin_token, "0123456789abcdef0123");
}

TEST_F(BootTest, TheWorkersOptionsCarryCudasSettingsOnlyOnCuda) {
  config_.cuda_sharing = "auto";  // resolved only by a cuda start; the workers accept vmm or legacy
  config_.cuda_tf32 = true;
  config_.backend = Backend::kHost;
  WorkerPoolOptions host = PoolOptions(config_, worker_, {1000});
  EXPECT_EQ(host.backend, Backend::kHost);
  EXPECT_EQ(host.sharing, WorkerPoolOptions{}.sharing);
  EXPECT_FALSE(host.tf32);
  config_.backend = Backend::kCuda;
  config_.cuda_sharing = "legacy";
  WorkerPoolOptions cuda = PoolOptions(config_, worker_, {1000, 2000});
  EXPECT_EQ(cuda.backend, Backend::kCuda);
  EXPECT_EQ(cuda.sharing, "legacy");
  EXPECT_TRUE(cuda.tf32);
  EXPECT_EQ(cuda.device_budgets, (std::vector<uint64_t>{1000, 2000}));
  EXPECT_EQ(cuda.worker_path, worker_);
}

TEST(ListenAddressTest, LoopbackAddressesOfBothFamiliesParse) {
  EXPECT_TRUE(ParseListenAddress("127.0.0.1:9464", false).ok());
  EXPECT_TRUE(ParseListenAddress("127.3.2.1:0", false).ok());
  EXPECT_TRUE(ParseListenAddress("[::1]:9464", false).ok());
  for (const char* bad : {"", ":", "127.0.0.1", "127.0.0.1:", "127.0.0.1:-1", "127.0.0.1:65536", "localhost:80",
                          "[::1]9464", "10.0.0.1:80", "[::]:80", "127.0.0.1:80x"}) {
    EXPECT_FALSE(ParseListenAddress(bad, false).ok()) << bad;
  }
  // Beyond loopback only when every request must carry an API key.
  for (const char* wide : {"0.0.0.0:8080", "10.0.0.1:80", "[::]:80"}) {
    EXPECT_EQ(ParseListenAddress(wide, false).status().code(), Code::kInvalidArgument) << wide;
    EXPECT_TRUE(ParseListenAddress(wide, true).ok()) << wide;
  }
  EXPECT_FALSE(ParseListenAddress("localhost:80", true).ok());
}

TEST(TakeoverCheckTest, OnlyAnAdminsLocalAskWithAChannelToAServingDaemonByHandIsHonoured) {
  TakeoverAsk ok;
  ok.admin = true;
  ok.seqpacket_channel = true;
  ok.accepting = true;
  EXPECT_TRUE(CheckTakeover(ok).ok());
  struct Case {
    const char* what;
    std::function<void(TakeoverAsk&)> spoil;
    Code code;
  };
  const std::vector<Case> cases = {
      {"over TCP", [](TakeoverAsk& a) { a.tcp = true; }, Code::kPermissionDenied},
      {"not an admin", [](TakeoverAsk& a) { a.admin = false; }, Code::kPermissionDenied},
      {"no channel", [](TakeoverAsk& a) { a.seqpacket_channel = false; }, Code::kInvalidArgument},
      {"stopping", [](TakeoverAsk& a) { a.stopping = true; }, Code::kUnavailable},
      {"under systemd", [](TakeoverAsk& a) { a.under_service_manager = true; }, Code::kFailedPrecondition},
      {"not accepting", [](TakeoverAsk& a) { a.accepting = false; }, Code::kUnavailable},
  };
  for (const Case& c : cases) {
    TakeoverAsk ask = ok;
    c.spoil(ask);
    EXPECT_EQ(CheckTakeover(ask).code(), c.code) << c.what;
  }
}

}  // namespace
}  // namespace warmpool::supervisor
