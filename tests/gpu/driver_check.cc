// warmpool-driver-check: questions about the CUDA driver that the documentation leaves open, and
// the costs the cuda backend is built on, measured with the same processes warmpoold uses. It
// prints one JSON object; scripts/gpu-check.sh runs it on a GPU (and the test command against the
// driver test double, where the answers are the double's, not a GPU's).
//
//   warmpool-driver-check lifetime [--bytes N]
//     Does a VMM allocation outlive the process that created it while only an exported descriptor
//     is held elsewhere? The parent (like warmpoold) never loads the driver: a warmpool-owner
//     allocates; child 1 imports and writes a pattern; child 2 imports and reads it back (the
//     control); the owner is SIGKILLed; child 3 imports the descriptor the parent still holds and
//     reads. warmpool does not depend on the answer (an owner's death makes its device's models
//     non-resident); the answer says whether that could be relaxed.
//   warmpool-driver-check attach [--bytes N] [--repeat R]
//     Time to import, map and set access of an exported allocation (a replica's attach, without
//     the engine), median of R.
//   warmpool-driver-check unpark [--bytes N] [--repeat R]
//     An unpark's copy as a worker makes it (CudaMemory: the parked copy's memfd mapping pinned for
//     the copy, chunks over several streams) against a plain cuMemcpyHtoD from a buffer that is
//     pinned already (cuMemHostAlloc), the same bytes in the same run; medians of R, the ratio
//     of their throughputs (goal >= 0.8), and the copied bytes verified.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/command_line.h"
#include "devmem/cuda_memory.h"
#include "devmem/cuda_service.h"
#include "devmem/host_memory.h"
#include "tests/gpu/in_process_memory.h"
#include "ipc/blocking_channel.h"
#include "ipc/child_arguments.h"
#include "ipc/warmpool.pb.h"
#include "ipc/owner.pb.h"

namespace warmpool {
namespace {

constexpr int kInheritedFd = 3;

std::string SelfPath() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  return n > 0 ? std::string(path, static_cast<size_t>(n)) : std::string();
}

uint8_t PatternByte(uint64_t i) { return static_cast<uint8_t>(i * 31 + 7); }

// Runs argv with `fd` as descriptor 3; returns the exit status (128 + signal when killed).
int RunWithFd(const std::vector<std::string>& args, int fd) {
  pid_t pid = fork();
  if (pid == 0) {
    if (fd >= 0) dup2(fd, kInheritedFd);  // clears close-on-exec on the copy
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Child roles: import descriptor 3 and write or verify the pattern. Exit 0 on success, 3 when the
// import fails, 4 when the bytes differ, 5 when the device cannot be opened.
int ChildRole(const std::string& role, uint64_t bytes) {
  Result<CudaDevice> device = CudaDevice::Open(0);
  if (!device.ok()) {
    std::fprintf(stderr, "%s\n", device.status().ToString().c_str());
    return 5;
  }
  const bool write = role == "write";
  Result<DeviceMapping> mapping = DeviceMapping::Import(*device, kInheritedFd, bytes,
                                                        write ? DeviceAccess::kReadWrite : DeviceAccess::kReadOnly);
  if (!mapping.ok()) {
    std::fprintf(stderr, "%s\n", mapping.status().ToString().c_str());
    return 3;
  }
  std::vector<uint8_t> host(bytes);
  const CudaDriver& cu = device->driver();
  if (write) {
    for (uint64_t i = 0; i < bytes; ++i) host[i] = PatternByte(i);
    return cu.cuMemcpyHtoD(mapping->ptr(), host.data(), bytes) == CUDA_SUCCESS ? 0 : 4;
  }
  if (cu.cuMemcpyDtoH(host.data(), mapping->ptr(), bytes) != CUDA_SUCCESS) return 4;
  for (uint64_t i = 0; i < bytes; ++i) {
    if (host[i] != PatternByte(i)) return 4;
  }
  return 0;
}

// An owner process on device 0 with the parent's end of its channel.
struct Owner {
  pid_t pid = -1;
  int fd = -1;
  std::unique_ptr<ipc::BlockingChannel> channel;
};

Result<Owner> StartOwner(const std::string& owner_path) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return Error(Code::kInternal, "socketpair failed");
  ipc::OwnerArguments arguments;
  arguments.channel_fd = kInheritedFd;
  arguments.sharing = "auto";
  std::vector<std::string> args = ipc::OwnerCommandLine(owner_path, arguments);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Owner owner;
  owner.pid = fork();
  if (owner.pid == 0) {
    dup2(sv[1], kInheritedFd);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(sv[1]);
  owner.fd = sv[0];
  owner.channel = std::make_unique<ipc::BlockingChannel>(sv[0], 1u << 20);
  v1::OwnerEnvelope hello;
  if (Status s = owner.channel->Read(hello); !s.ok() || !hello.has_hello()) {
    return Error(Code::kUnavailable, "{} did not start (see its log above)", owner_path);
  }
  return owner;
}

Result<int> Allocate(Owner& owner, uint64_t bytes) {
  v1::OwnerEnvelope request;
  request.mutable_allocate()->set_id(1);
  request.mutable_allocate()->set_bytes(bytes);
  if (Status s = owner.channel->Write(request); !s.ok()) return s;
  v1::OwnerEnvelope reply;
  if (Status s = owner.channel->Read(reply); !s.ok()) return s;
  if (reply.allocated().has_error()) return Status(Code::kInternal, reply.allocated().error().message());
  int fd = owner.channel->TakeFd();
  if (fd < 0) return Error(Code::kInternal, "the owner answered without a descriptor (legacy sharing?)");
  return fd;
}

int Lifetime(const std::string& owner_path, uint64_t bytes) {
  nlohmann::json out{{"check", "lifetime"}, {"bytes", bytes}};
  Result<Owner> owner = StartOwner(owner_path);
  if (!owner.ok()) {
    out["error"] = owner.status().message();
    std::printf("%s\n", out.dump().c_str());
    return 1;
  }
  Result<int> fd = Allocate(*owner, bytes);
  if (!fd.ok()) {
    out["error"] = fd.status().message();
    std::printf("%s\n", out.dump().c_str());
    return 1;
  }
  const std::string self = SelfPath();
  const std::string size = std::to_string(bytes);
  out["write_status"] = RunWithFd({self, "child", "--role", "write", "--bytes", size}, *fd);
  out["read_before_owner_death_status"] = RunWithFd({self, "child", "--role", "read", "--bytes", size}, *fd);
  kill(owner->pid, SIGKILL);
  waitpid(owner->pid, nullptr, 0);
  const int after = RunWithFd({self, "child", "--role", "read", "--bytes", size}, *fd);
  out["read_after_owner_death_status"] = after;
  out["import_after_owner_death"] = after != 3 && after != 5;
  out["pattern_intact_after_owner_death"] = after == 0;
  out["answer"] = after == 0 ? "survives: the held descriptor kept the allocation"
                             : "does not survive: the allocation went with its owner";
  close(*fd);
  close(owner->fd);
  std::printf("%s\n", out.dump().c_str());
  return out["write_status"] == 0 && out["read_before_owner_death_status"] == 0 ? 0 : 1;
}

int Attach(uint64_t bytes, int repeat) {
  nlohmann::json out{{"check", "attach"}, {"bytes", bytes}, {"repeat", repeat}};
  Result<CudaDevice> device = CudaDevice::Open(0);
  Result<DeviceAllocation> allocation = device.ok() ? DeviceAllocation::Create(*device, bytes)
                                                    : Result<DeviceAllocation>(device.status());
  Result<int> fd = allocation.ok() ? allocation->Export() : Result<int>(allocation.status());
  if (!fd.ok()) {
    out["error"] = fd.status().message();
    std::printf("%s\n", out.dump().c_str());
    return 1;
  }
  std::vector<double> micros;
  for (int i = 0; i < repeat; ++i) {
    auto start = std::chrono::steady_clock::now();
    Result<DeviceMapping> mapping = DeviceMapping::Import(*device, *fd, bytes, DeviceAccess::kReadOnly);
    auto end = std::chrono::steady_clock::now();
    if (!mapping.ok()) {
      out["error"] = mapping.status().message();
      std::printf("%s\n", out.dump().c_str());
      return 1;
    }
    out["read_only"] = mapping->read_only();
    micros.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  close(*fd);
  std::sort(micros.begin(), micros.end());
  out["median_us"] = micros[micros.size() / 2];
  out["max_us"] = micros.back();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

double MedianMs(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int Unpark(uint64_t bytes, int repeat) {
  nlohmann::json out{{"check", "unpark"}, {"bytes", bytes}, {"repeat", repeat}};
  auto fail = [&](const Status& s) {
    out["error"] = s.message();
    std::printf("%s\n", out.dump().c_str());
    return 1;
  };
  // The device memory a worker would be granted (created here: one process plays both parts).
  Result<std::unique_ptr<InProcessCudaMemory>> opened = InProcessCudaMemory::Open(0);
  if (!opened.ok()) return fail(opened.status());
  std::unique_ptr<InProcessCudaMemory> in_process = std::move(*opened);
  CudaMemory* memory = &in_process->memory();
  const wp_device_memory* service = memory->service();
  wp_region region{nullptr, 0, -1};
  if (service->alloc(service->ctx, bytes, &region) != WP_OK) return fail(Error(Code::kResourceExhausted, "cannot allocate {} bytes", bytes));
  // The parked copy: a memfd as the supervisor holds it, mapped as a worker maps it.
  Result<int> parked = [&]() -> Result<int> {
    HostMemory host;
    Result<HostRegion> r = host.Allocate(bytes, "warmpool-parked");
    if (!r.ok()) return r.status();
    for (uint64_t i = 0; i < bytes; ++i) static_cast<uint8_t*>(r->ptr)[i] = PatternByte(i);
    int fd = dup(r->fd);
    host.Free(*r);
    return fd;
  }();
  if (!parked.ok()) return fail(parked.status());
  HostMemory host;
  Result<HostRegion> mapped = host.Import(*parked, bytes);
  if (!mapped.ok()) return fail(mapped.status());
  void* pinned = nullptr;
  const CudaDriver& cu = memory->device().driver();
  if (Status s = cu.Check(cu.cuMemHostAlloc(&pinned, bytes, 0), "cuMemHostAlloc"); !s.ok()) return fail(s);
  std::memcpy(pinned, mapped->ptr, bytes);
  std::vector<double> plain_ms, unpark_ms;
  for (int i = 0; i < repeat; ++i) {  // interleaved, so that drift hits both alike
    auto t0 = std::chrono::steady_clock::now();
    if (Status s = cu.Check(cu.cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(region.ptr), pinned, bytes), "cuMemcpyHtoD");
        !s.ok()) {
      return fail(s);
    }
    auto t1 = std::chrono::steady_clock::now();
    if (Status s = memory->CopyToDevice(region, 0, mapped->ptr, bytes); !s.ok()) return fail(s);
    auto t2 = std::chrono::steady_clock::now();
    plain_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    unpark_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
  }
  std::vector<uint8_t> check(bytes);
  bool intact = cu.cuMemcpyDtoH(check.data(), reinterpret_cast<CUdeviceptr>(region.ptr), bytes) == CUDA_SUCCESS;
  for (uint64_t i = 0; intact && i < bytes; ++i) intact = check[i] == PatternByte(i);
  cu.cuMemFreeHost(pinned);
  host.Free(*mapped);
  close(*parked);
  service->free(service->ctx, &region);
  const double plain = MedianMs(plain_ms), unpark = MedianMs(unpark_ms);
  out["pinned_memcpy_median_ms"] = plain;
  out["unpark_median_ms"] = unpark;
  out["pinned_memcpy_gbps"] = bytes / plain / 1e6;
  out["unpark_gbps"] = bytes / unpark / 1e6;
  out["unpark_over_pinned_memcpy"] = plain / unpark;
  out["goal"] = ">= 0.8";
  out["bytes_intact"] = intact;
  std::printf("%s\n", out.dump().c_str());
  return intact ? 0 : 1;
}

}  // namespace
}  // namespace warmpool

int main(int argc, char** argv) {
  CLI::App app{"questions about the CUDA driver that warmpool's cuda backend depends on"};
  app.require_subcommand(1);
  uint64_t bytes = 64ull << 20;
  int repeat = 20;
  std::string role;
  std::string owner;
  CLI::App* lifetime = app.add_subcommand("lifetime", "does an allocation outlive its owner while a descriptor is held");
  lifetime->add_option("--bytes", bytes, "allocation size");
  lifetime->add_option("--owner", owner, "the warmpool-owner binary (default: next to this one)");
  CLI::App* attach = app.add_subcommand("attach", "time to import and map an exported allocation");
  attach->add_option("--bytes", bytes, "allocation size");
  attach->add_option("--repeat", repeat, "imports to time")->check(CLI::Range(1, 100000));
  CLI::App* unpark = app.add_subcommand("unpark", "an unpark's copy against a plain pinned cuMemcpyHtoD");
  unpark->add_option("--bytes", bytes, "bytes copied");
  unpark->add_option("--repeat", repeat, "copies of each kind")->check(CLI::Range(1, 100000));
  CLI::App* child = app.add_subcommand("child", "internal: import descriptor 3 and write or read the pattern");
  child->add_option("--role", role)->required()->check(CLI::IsMember({"write", "read"}));
  child->add_option("--bytes", bytes);
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (owner.empty()) {
    std::string self = warmpool::SelfPath();
    owner = self.substr(0, self.rfind('/') + 1) + "warmpool-owner";
  }
  if (*child) return warmpool::ChildRole(role, bytes);
  if (*lifetime) return warmpool::Lifetime(owner, bytes);
  if (*unpark) return warmpool::Unpark(bytes, repeat);
  return warmpool::Attach(bytes, repeat);
}
