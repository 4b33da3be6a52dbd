#include "supervisor/device_probe.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

#include "ipc/child_arguments.h"
#include "supervisor/child_process.h"

namespace warmpool::supervisor {

namespace {

constexpr uint64_t kProbeTimeoutMs = 30000;  // a driver's first cuInit on a big machine takes seconds

}  // namespace

Result<std::vector<ProbedDevice>> ProbeDevices(const std::string& owner_path, uint64_t timeout_ms) {
  if (access(owner_path.c_str(), X_OK) != 0) {
    return Error(Code::kUnavailable, "{} is missing: this installation has no cuda backend", owner_path);
  }
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return Error(Code::kUnavailable, "pipe: {}", std::strerror(errno));
  // Built before fork: the child only execs.
  std::vector<char*> env = ChildEnvironment();
  ipc::OwnerArguments arguments;
  arguments.probe = true;
  std::vector<std::string> args = ipc::OwnerCommandLine(owner_path, arguments);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    close(out[0]);
    close(out[1]);
    return Error(Code::kUnavailable, "fork: {}", std::strerror(errno));
  }
  if (pid == 0) {
    // Like every helper: stdout to us, no inherited descriptor beyond stderr (a socket-activated
    // listener, say), none of the service manager's variables.
    dup2(out[1], 1);
    close_range(3, ~0u, 0);
    execve(argv[0], argv.data(), env.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{out[0], POLLIN, 0};
    int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[4096];
    ssize_t n = read(out[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < (1u << 20)) text.append(buffer, static_cast<size_t>(n));
  }
  close(out[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return Error(Code::kUnavailable, "the device probe ({} --probe) did not answer within {} ms", owner_path, timeout_ms);
  }
  nlohmann::json probe = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (probe.is_discarded() || !probe.is_object()) {
    return Error(Code::kUnavailable, "the device probe ({} --probe) printed no answer (exit status {})",
                 owner_path, WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  if (probe.contains("error")) {
    return Status(Code::kUnavailable, probe["error"].is_string() ? probe["error"].get<std::string>() : "probe failed");
  }
  std::vector<ProbedDevice> devices;
  for (const nlohmann::json& d : probe.value("devices", nlohmann::json::array())) {
    ProbedDevice device;
    device.ordinal = d.value("ordinal", 0u);
    device.name = d.value("name", std::string());
    device.total_bytes = d.value("total_bytes", uint64_t{0});
    device.free_bytes = d.value("free_bytes", uint64_t{0});
    device.granularity = d.value("granularity", uint64_t{0});
    device.fd_handles = d.value("fd_handles", false);
    devices.push_back(std::move(device));
  }
  if (devices.empty()) return Error(Code::kUnavailable, "the CUDA driver reports no device");
  return devices;
}

Result<BackendChoice> ChooseBackend(Backend asked, const std::string& owner_path) {
  BackendChoice choice;
  if (asked == Backend::kHost) {
    choice.why = "asked for";
    return choice;
  }
#ifndef WARMPOOL_HAVE_CUDA
  if (asked == Backend::kCuda) {
    return Error(Code::kFailedPrecondition,
                 "backend \"cuda\" is not in this build (it was built without the CUDA toolkit): run "
                 "with --backend host (or auto)");
  }
  choice.why = "this build has no cuda backend";
  return choice;
#else
  Result<std::vector<ProbedDevice>> devices = ProbeDevices(owner_path, kProbeTimeoutMs);
  if (!devices.ok()) {
    if (asked == Backend::kCuda) {
      return Error(Code::kFailedPrecondition, "backend \"cuda\" cannot start: {}", devices.status().message());
    }
    choice.why = "no usable GPU: " + devices.status().message();
    return choice;
  }
  choice.cuda = true;
  choice.devices = std::move(*devices);
  choice.why = asked == Backend::kCuda ? "asked for" : "a usable GPU was found";
  return choice;
#endif
}

}  // namespace warmpool::supervisor
