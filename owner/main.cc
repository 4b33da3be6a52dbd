// warmpool-owner: the allocation owner of one CUDA device, started by warmpoold (see owner.h); or,
// with --probe, a short-lived child that prints the machine's CUDA devices as JSON and exits, so
// that warmpoold learns about devices without ever loading the driver itself.
// Exit status (ipc/exit_status.h): kChildStopped on a clean stop or a successful probe, kChildFatal
// on fatal configuration (no driver, no such device, a sharing mode the device lacks), kChildFailed
// otherwise.
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/command_line.h"
#include "common/logging.h"
#include "ipc/child_arguments.h"
#include "ipc/exit_status.h"
#include "owner/owner.h"

int main(int argc, char** argv) {
  warmpool::ipc::OwnerArguments arguments;
  CLI::App app{"warmpool device owner; started by warmpoold, not meant to be run by hand"};
  warmpool::ipc::DeclareOwnerArguments(app, arguments);
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;

  if (arguments.probe) {
    warmpool::Result<std::string> devices = warmpool::owner::ProbeDevices();
    if (!devices.ok()) {
      std::printf("%s\n", nlohmann::json{{"error", devices.status().message()}}.dump().c_str());
      return warmpool::ipc::kChildFatal;
    }
    std::printf("%s\n", devices->c_str());
    return warmpool::ipc::kChildStopped;
  }

  // Die with the supervisor; it may have died before prctl took effect: check after.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (arguments.parent != 0 && getppid() != arguments.parent) return warmpool::ipc::kChildStopped;
  signal(SIGPIPE, SIG_IGN);
  warmpool::SetupLogging("owner", fmt::format("owner[{}]", arguments.device), "info");
  warmpool::Result<warmpool::owner::Sharing> mode = warmpool::owner::ParseSharing(arguments.sharing);
  if (!mode.ok()) {
    spdlog::critical("{}", mode.status().message());
    return warmpool::ipc::kChildFatal;
  }
  warmpool::owner::OwnerOptions options;
  options.channel_fd = arguments.channel_fd;
  options.device = arguments.device;
  options.sharing = *mode;
  warmpool::owner::DeviceOwner owner(options);
  if (warmpool::Status s = owner.Start(); !s.ok()) {
    spdlog::critical("cannot start: {}", s.ToString());
    return warmpool::ipc::kChildFatal;
  }
  return owner.Run();
}
