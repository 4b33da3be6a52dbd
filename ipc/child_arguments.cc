#include "ipc/child_arguments.h"

#include <map>

#include <CLI/CLI.hpp>

namespace warmpool::ipc {

std::vector<std::string> WorkerCommandLine(const std::string& program, const WorkerArguments& a) {
  std::vector<std::string> args = {
      program,
      "--channel-fd", std::to_string(a.channel_fd),
      "--slot", std::to_string(a.slot),
      "--generation", std::to_string(a.generation),
      "--device", std::to_string(a.device),
      "--instance", a.instance,
      "--budget", std::to_string(a.budget_bytes),
      "--max-frame-bytes", std::to_string(a.max_frame_bytes),
      "--parent", std::to_string(a.parent),
      "--engine-dir", a.engine_dir,
      "--backend", std::string(BackendName(a.backend)),
      "--sharing", a.sharing,
      "--threads", std::to_string(a.threads),
  };
  if (a.tf32) args.push_back("--tf32");
  return args;
}

void DeclareWorkerArguments(CLI::App& app, WorkerArguments& a) {
  app.add_option("--channel-fd", a.channel_fd, "inherited socketpair end")->required();
  app.add_option("--slot", a.slot, "worker slot in the segment")->required();
  app.add_option("--generation", a.generation, "spawn generation of this slot")->required();
  app.add_option("--device", a.device, "device index");
  app.add_option("--instance", a.instance, "daemon instance (segment name)");
  app.add_option("--budget", a.budget_bytes, "device memory budget in bytes (0: unlimited)");
  app.add_option("--max-frame-bytes", a.max_frame_bytes, "largest frame accepted");
  app.add_option("--parent", a.parent, "pid of the supervisor");
  app.add_option("--engine-dir", a.engine_dir, "directory of engine plugins (empty: built-ins only)");
  app.add_option("--backend", a.backend, "device memory: host or cuda")
      ->transform(CLI::CheckedTransformer(std::map<std::string, Backend>{
          {std::string(BackendName(Backend::kHost)), Backend::kHost},
          {std::string(BackendName(Backend::kCuda)), Backend::kCuda}}));
  app.add_option("--sharing", a.sharing, "cuda: how the device's owner shares memory")
      ->check(CLI::IsMember({"vmm", "legacy"}));
  app.add_option("--threads", a.threads, "threads the engines compute with")->check(CLI::Range(1, 4096));
  app.add_flag("--tf32", a.tf32, "cuda: f32 dense layers on TF32 tensor cores");
}

std::vector<std::string> OwnerCommandLine(const std::string& program, const OwnerArguments& a) {
  if (a.probe) return {program, "--probe"};
  return {program,
          "--channel-fd", std::to_string(a.channel_fd),
          "--device", std::to_string(a.device),
          "--sharing", a.sharing,
          "--parent", std::to_string(a.parent)};
}

void DeclareOwnerArguments(CLI::App& app, OwnerArguments& a) {
  app.add_flag("--probe", a.probe, "print this machine's CUDA devices as JSON and exit");
  app.add_option("--channel-fd", a.channel_fd, "inherited socketpair end");
  app.add_option("--device", a.device, "CUDA device ordinal");
  // Checked by the owner itself (owner::ParseSharing), which says what the configuration must say.
  app.add_option("--sharing", a.sharing, "auto, vmm or legacy");
  app.add_option("--parent", a.parent, "pid of the supervisor");
}

}  // namespace warmpool::ipc
