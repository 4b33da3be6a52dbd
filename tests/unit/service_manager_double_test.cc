// The stand-in for systemd's descriptor store (launch/service_manager_double.h) against the real
// WarmStore: a start gets every descriptor sent before it, and WaitForKept tells the store a
// daemon left up to date from one it was killed in the middle of writing (a handle stored before
// the manifest that names it).
#include "launch/service_manager_double.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include <gtest/gtest.h>

#include "supervisor/warm_store.h"
#include "tests/unit/kept_weights.h"

namespace warmpool::launch {
namespace {

using namespace std::chrono_literals;

supervisor::KeptWeights Kept(const std::string& name, int fd) {
  return supervisor::testing::Kept(name, fd, 4096, /*parked=*/false);
}

class ServiceManagerDoubleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/warmpool-smd-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto opened = ServiceManagerDouble::Open(dir_ + "/notify");
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    manager_ = std::move(*opened);
    setenv("NOTIFY_SOCKET", (dir_ + "/notify").c_str(), 1);
  }
  void TearDown() override {
    unsetenv("NOTIFY_SOCKET");
    manager_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::unique_ptr<ServiceManagerDouble> manager_;
};

TEST_F(ServiceManagerDoubleTest, AStartGetsEverythingSentBeforeIt) {
  for (int round = 0; round < 50; round++) {
    const int fd = supervisor::testing::Region(64, 1);
    const std::string name = "wp.w.m." + std::to_string(round);
    const std::string state = "FDSTORE=1\nFDNAME=" + name;
    ASSERT_GT(sd_pid_notify_with_fds(0, 0, state.c_str(), &fd, 1), 0);
    close(fd);
    DaemonSpec spec;
    manager_->PrepareStart(spec);  // at once: the reader has had no time of its own
    ASSERT_EQ(spec.listen_fds.size(), static_cast<size_t>(round + 1));
    EXPECT_EQ(spec.listen_fds.back().second, name);
  }
}

TEST_F(ServiceManagerDoubleTest, AHandleStoredBeforeTheManifestThatNamesItIsNotAnUpToDateStore) {
  const int a = supervisor::testing::Region(4096, 1), b = supervisor::testing::Region(4096, 2);
  supervisor::WarmStore store("x", /*enabled=*/true);
  store.Sync({Kept("a", a)});
  ASSERT_TRUE(manager_->WaitForKept(1, 2s));

  // Where a daemon killed in the middle of a Sync leaves the store: b's handle is there, the
  // manifest that would name it is not. One manifest and two handles, as an up-to-date store of
  // two models has, which is what counting names took for one.
  const std::string state = "FDSTORE=1\nFDNAME=wp.w.b.0000000000000000.1-1";
  ASSERT_GT(sd_pid_notify_with_fds(0, 0, state.c_str(), &b, 1), 0);
  manager_->Settle();
  size_t manifests = 0, handles = 0;
  for (const auto& [name, count] : manager_->Stored()) (name.rfind("wp.manifest.", 0) == 0 ? manifests : handles) += count;
  EXPECT_EQ(manifests, 1u);
  EXPECT_EQ(handles, 2u);
  EXPECT_FALSE(manager_->WaitForKept(2, 100ms));

  sd_notify(0, "FDSTOREREMOVE=1\nFDNAME=wp.w.b.0000000000000000.1-1");
  store.Sync({Kept("a", a), Kept("b", b)});
  EXPECT_TRUE(manager_->WaitForKept(2, 2s));
  bool names_both = manager_->WaitForKept(
      [](const v1::KeptManifest& m) { return m.models_size() == 2 && m.models(0).name() == "a" && m.models(1).name() == "b"; },
      0ms);
  EXPECT_TRUE(names_both);
  close(a);
  close(b);
}

}  // namespace
}  // namespace warmpool::launch
