// The device owner process (warmpool-owner) against the driver test double: allocation, export,
// legacy IPC, its errors, its death, and the device probe.
#include "owner/owner.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "devmem/cuda_memory.h"
#include "devmem/cuda_service.h"
#include "ipc/blocking_channel.h"
#include "ipc/child_arguments.h"
#include "tests/unit/cuda_device_fixture.h"

namespace warmpool::owner {
namespace {

constexpr uint64_t kMiB = 1u << 20;
// The binaries of this build, or of a bundle moved elsewhere (scripts/gpu-check.sh sets it).
std::string BinDir() {
  const char* dir = std::getenv("WARMPOOL_BIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : WARMPOOL_BIN_DIR;
}
const std::string kOwner = BinDir() + "/warmpool-owner";

// Runs argv with extra environment entries; stdout captured when out is given.
pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env, int channel,
            int* out = nullptr) {
  int pipe_fds[2] = {-1, -1};
  if (out != nullptr && pipe(pipe_fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
    if (channel >= 0) dup2(channel, 3);
    if (out != nullptr) dup2(pipe_fds[1], 1);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (out != nullptr) {
    close(pipe_fds[1]);
    *out = pipe_fds[0];
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string ReadAll(int fd) {
  std::string text;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<size_t>(n));
  close(fd);
  return text;
}

// An owner process on device 0 of the double, and the supervisor's end of its channel.
class OwnerProcess {
 public:
  explicit OwnerProcess(std::vector<std::string> env, std::string sharing = "auto") {
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
    // The child's end must survive exec: dup2 onto 3 clears CLOEXEC.
    ipc::OwnerArguments arguments;
    arguments.sharing = sharing;
    pid_ = Spawn(ipc::OwnerCommandLine(kOwner, arguments), env, sv[1]);
    close(sv[1]);
    channel_.emplace(sv[0], 1u << 20);
    fd_ = sv[0];
  }
  ~OwnerProcess() {
    close(fd_);
    if (pid_ > 0) Wait(pid_);
  }
  ipc::BlockingChannel& channel() { return *channel_; }
  pid_t pid() const { return pid_; }
  int Stop() {
    shutdown(fd_, SHUT_RDWR);
    int status = Wait(pid_);
    pid_ = -1;
    return status;
  }
  v1::OwnerAllocated Allocate(uint64_t id, uint64_t bytes, int* fd = nullptr) {
    v1::OwnerEnvelope request;
    request.mutable_allocate()->set_id(id);
    request.mutable_allocate()->set_bytes(bytes);
    EXPECT_TRUE(channel_->Write(request).ok());
    v1::OwnerEnvelope reply;
    Status s = channel_->Read(reply);
    EXPECT_TRUE(s.ok()) << s.ToString();
    int received = reply.allocated().has_error() ? -1 : channel_->TakeFd();
    if (fd != nullptr) *fd = received;
    else if (received >= 0) close(received);
    return reply.allocated();
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::optional<ipc::BlockingChannel> channel_;
};

const std::vector<std::string> kTwoDevices = {"WARMPOOL_FAKE_CUDA_DEVICES=2", "WARMPOOL_FAKE_CUDA_MEMORY=67108864"};

using OwnerTest = warmpool::testing::CudaDeviceTest;

TEST_F(OwnerTest, SaysHelloWithItsDevice) {
  OwnerProcess owner(kTwoDevices);
  v1::OwnerEnvelope hello;
  ASSERT_TRUE(owner.channel().Read(hello).ok());
  ASSERT_TRUE(hello.has_hello());
  EXPECT_EQ(hello.hello().device(), 0u);
  EXPECT_EQ(hello.hello().pid(), owner.pid());
  EXPECT_FALSE(hello.hello().name().empty());
  EXPECT_GT(hello.hello().total_bytes(), 0u);
  EXPECT_GT(hello.hello().granularity(), 0u);
  EXPECT_EQ(hello.hello().sharing(), "vmm");
  EXPECT_EQ(owner.Stop(), 0);  // a closed channel is a clean stop
}

TEST_F(OwnerTest, AllocationsGoToImportersThatShareThem) {
  OwnerProcess owner(kTwoDevices);
  v1::OwnerEnvelope hello;
  ASSERT_TRUE(owner.channel().Read(hello).ok());
  int fd = -1;
  v1::OwnerAllocated done = owner.Allocate(7, 3 * kMiB, &fd);
  ASSERT_FALSE(done.has_error()) << done.error().message();
  EXPECT_EQ(done.id(), 7u);
  EXPECT_EQ(done.bytes() % hello.hello().granularity(), 0u);
  ASSERT_GE(fd, 0);

  // Two importers (a loading worker and a replica, here one process): what one writes the other reads.
  Result<DeviceMapping> writer = DeviceMapping::Import(*device_, fd, 3 * kMiB, DeviceAccess::kReadWrite);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  std::vector<uint8_t> pattern(3 * kMiB);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<uint8_t>(i * 13 + 1);
  ASSERT_EQ(device_->driver().cuMemcpyHtoD(writer->ptr(), pattern.data(), pattern.size()), CUDA_SUCCESS);
  Result<DeviceMapping> reader = DeviceMapping::Import(*device_, fd, 3 * kMiB, DeviceAccess::kReadOnly);
  ASSERT_TRUE(reader.ok());
  std::vector<uint8_t> read(pattern.size());
  ASSERT_EQ(device_->driver().cuMemcpyDtoH(read.data(), reader->ptr(), read.size()), CUDA_SUCCESS);
  EXPECT_EQ(read, pattern);
  close(fd);

  // The same id twice is refused; the owner goes on serving.
  v1::OwnerAllocated again = owner.Allocate(7, kMiB);
  ASSERT_TRUE(again.has_error());
  EXPECT_EQ(again.error().code(), v1::INVALID_ARGUMENT);
  v1::OwnerAllocated other = owner.Allocate(8, kMiB);
  EXPECT_FALSE(other.has_error()) << other.error().message();
}

TEST_F(OwnerTest, AFullDeviceIsResourceExhaustedAndTheOwnerServesOn) {
  OwnerProcess owner(kTwoDevices);
  v1::OwnerEnvelope hello;
  ASSERT_TRUE(owner.channel().Read(hello).ok());
  v1::OwnerAllocated big = owner.Allocate(1, hello.hello().total_bytes() + kMiB);
  ASSERT_TRUE(big.has_error());
  EXPECT_EQ(big.error().code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_NE(big.error().message().find("device 0"), std::string::npos) << big.error().message();
  // Released memory is memory again: fill the device, release, allocate again.
  v1::OwnerAllocated most = owner.Allocate(2, hello.hello().total_bytes() - 2 * kMiB);
  ASSERT_FALSE(most.has_error()) << most.error().message();
  EXPECT_TRUE(owner.Allocate(3, 4 * kMiB).has_error());
  v1::OwnerEnvelope release;
  release.mutable_release()->set_id(2);
  ASSERT_TRUE(owner.channel().Write(release).ok());
  EXPECT_FALSE(owner.Allocate(4, 4 * kMiB).has_error());
}

TEST_F(OwnerTest, LegacySharingNamesMemoryByAnIpcHandleThatDiesWithTheOwner) {
  OwnerProcess owner(kTwoDevices, "legacy");
  v1::OwnerEnvelope hello;
  ASSERT_TRUE(owner.channel().Read(hello).ok());
  EXPECT_EQ(hello.hello().sharing(), "legacy");
  v1::OwnerAllocated done = owner.Allocate(1, 2 * kMiB);
  ASSERT_FALSE(done.has_error()) << done.error().message();
  ASSERT_EQ(done.ipc_handle().size(), 64u);
  {
    Result<LegacyMapping> mapping = LegacyMapping::Open(*device_, done.ipc_handle(), 2 * kMiB);
    ASSERT_TRUE(mapping.ok()) << mapping.status().ToString();
    std::vector<uint8_t> pattern(2 * kMiB, 0x5a);
    ASSERT_EQ(device_->driver().cuMemcpyHtoD(mapping->ptr(), pattern.data(), pattern.size()), CUDA_SUCCESS);
    // Opened again in the same process: the same pointer, counted; closing one leaves the other.
    std::optional<LegacyMapping> again;
    {
      Result<LegacyMapping> second = LegacyMapping::Open(*device_, done.ipc_handle(), 2 * kMiB);
      ASSERT_TRUE(second.ok()) << second.status().ToString();
      EXPECT_EQ(second->ptr(), mapping->ptr());
      again.emplace(std::move(*second));
    }
    again.reset();
    std::vector<uint8_t> read(pattern.size());
    ASSERT_EQ(device_->driver().cuMemcpyDtoH(read.data(), mapping->ptr(), read.size()), CUDA_SUCCESS);
    EXPECT_EQ(read, pattern);
  }
  kill(owner.pid(), SIGKILL);
  owner.Stop();
  EXPECT_FALSE(LegacyMapping::Open(*device_, done.ipc_handle(), 2 * kMiB).ok());
}

TEST_F(OwnerTest, AWorkerImportingALegacyHandleTwiceKeepsItUntilBothLetGo) {
  OwnerProcess owner(kTwoDevices, "legacy");
  v1::OwnerEnvelope hello;
  ASSERT_TRUE(owner.channel().Read(hello).ok());
  v1::OwnerAllocated done = owner.Allocate(1, 2 * kMiB);
  ASSERT_FALSE(done.has_error()) << done.error().message();
  Result<int> named = LegacyHandleToFd(done.ipc_handle(), done.bytes());
  ASSERT_TRUE(named.ok());
  device_.reset();  // CudaMemory opens its own
  Result<std::unique_ptr<CudaMemory>> memory = CudaMemory::Open(
      0, CudaSharing::kLegacy, [](uint64_t) -> Result<OwnerGrant> { return Status(Code::kInternal, "none"); },
      [](uint64_t) {});
  ASSERT_TRUE(memory.ok()) << memory.status().ToString();
  const wp_device_memory* service = (*memory)->service();
  wp_region first{}, second{};
  ASSERT_EQ(service->import(service->ctx, *named, 2 * kMiB, &first), WP_OK);
  ASSERT_EQ(service->import(service->ctx, *named, 2 * kMiB, &second), WP_OK);
  EXPECT_EQ(first.ptr, second.ptr) << "the driver hands out one pointer per handle";
  std::vector<uint8_t> pattern(4096, 0x3c);
  ASSERT_EQ(service->write(service->ctx, &first, 0, pattern.data(), pattern.size()), WP_OK);
  service->free(service->ctx, &first);
  EXPECT_EQ((*memory)->regions(), 1u);
  std::vector<uint8_t> read(pattern.size());
  ASSERT_EQ(service->read(service->ctx, &second, 0, read.data(), read.size()), WP_OK) << "still mapped";
  EXPECT_EQ(read, pattern);
  service->free(service->ctx, &second);
  EXPECT_EQ((*memory)->regions(), 0u);
  close(*named);
}

TEST_F(OwnerTest, VmmAskedOfADeviceWithoutDescriptorsIsFatalConfiguration) {
  std::vector<std::string> env = kTwoDevices;
  env.push_back("WARMPOOL_FAKE_CUDA_FD_HANDLES=0");
  OwnerProcess refuses(env, "vmm");
  EXPECT_EQ(refuses.Stop(), 2);
  OwnerProcess falls_back(env, "auto");
  v1::OwnerEnvelope hello;
  ASSERT_TRUE(falls_back.channel().Read(hello).ok());
  EXPECT_EQ(hello.hello().sharing(), "legacy");
}

TEST_F(OwnerTest, NoDeviceIsFatalConfiguration) {
  OwnerProcess none({"WARMPOOL_FAKE_CUDA_DEVICES=0"});
  EXPECT_EQ(none.Stop(), 2);
}

TEST(ProbeTest, ListsTheDevices) {
  int out = -1;
  ipc::OwnerArguments arguments;
  arguments.probe = true;
  pid_t pid = Spawn(ipc::OwnerCommandLine(kOwner, arguments), kTwoDevices, -1, &out);
  std::string text = ReadAll(out);
  ASSERT_EQ(Wait(pid), 0) << text;
  nlohmann::json probe = nlohmann::json::parse(text);
  ASSERT_EQ(probe["devices"].size(), 2u) << text;
  EXPECT_EQ(probe["devices"][1]["ordinal"], 1);
  EXPECT_EQ(probe["devices"][0]["total_bytes"], 64u << 20);
  EXPECT_TRUE(probe["devices"][0]["fd_handles"].get<bool>());
  EXPECT_GT(probe["driver_version"].get<int>(), 0);
}

TEST(ProbeTest, SaysWhyThereIsNoDevice) {
  int out = -1;
  pid_t pid = Spawn({kOwner, "--probe"}, {"WARMPOOL_FAKE_CUDA_DEVICES=0"}, -1, &out);
  std::string text = ReadAll(out);
  EXPECT_EQ(Wait(pid), 2);
  EXPECT_NE(nlohmann::json::parse(text)["error"].get<std::string>().find("CUDA_ERROR_NO_DEVICE"),
            std::string::npos) << text;
  // Without any libcuda.so.1 (this machine's own, if any, is not the double; skip then).
  if (getenv("LD_LIBRARY_PATH") == nullptr) GTEST_SKIP();
  pid = Spawn({kOwner, "--probe"}, {"LD_LIBRARY_PATH=/nonexistent"}, -1, &out);
  text = ReadAll(out);
  int status = Wait(pid);
  if (text.find("libcuda.so.1") == std::string::npos) GTEST_SKIP() << "a driver is installed: " << text;
  EXPECT_EQ(status, 2);
  EXPECT_NE(nlohmann::json::parse(text)["error"].get<std::string>().find("--backend host"), std::string::npos);
}

}  // namespace
}  // namespace warmpool::owner
