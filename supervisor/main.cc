// warmpoold: the warmpool supervisor. Runs in the foreground and logs to stderr.
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "common/command_line.h"

#include "common/logging.h"
#include "common/paths.h"

#include "common/units.h"
#include "supervisor/boot.h"
#include "supervisor/config.h"
#include "supervisor/daemon.h"

int main(int argc, char** argv) {
  using namespace warmpool;
  CLI::App app{
      "warmpoold: the warmpool supervisor. Loads models on demand into worker processes, keeps "
      "them warm and evicts the least recently used under a memory budget. Runs in the "
      "foreground and logs to stderr (with syslog priorities under systemd). SIGHUP reloads the "
      "model registry and the API keys; SIGTERM or SIGINT stops accepting, lets accepted requests finish within "
      "[daemon] drain_timeout_ms and stops (a second signal stops at once)."};
  std::string config_file, socket, models_dir, backend, instance, budget, log_level = "info";
  std::string worker_path;
  app.add_option("--config", config_file, "TOML configuration file (optional)");
  app.add_option("--socket", socket, "client socket path (default $XDG_RUNTIME_DIR/warmpool.sock or /tmp/warmpool-$UID.sock)");
  app.add_option("--models-dir", models_dir, "directory whose *.safetensors files register by file stem, and whose subdirectories with a config.json (Hugging Face model directories) by name (default ./models)");
  app.add_option("--backend", backend, "device backend: auto, host or cuda (default auto)")
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_option("--instance", instance, "instance name: segment /dev/shm/warmpool.NAME (default 'default')");
  app.add_option("--budget", budget, "device memory budget, e.g. 512MiB or 2GiB (default: a quarter of RAM)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  app.add_option("--worker", worker_path, "warmpool-worker binary (default: next to warmpoold)");
  std::string http_listen;
  app.add_option("--http", http_listen,
                 "also serve the HTTP API and /metrics on this TCP address, e.g. 127.0.0.1:9464 "
                 "([http] listen; beyond loopback only with [http] api_keys_file)");
  bool fault_injection = false;
  app.add_flag("--enable-fault-injection", fault_injection,
               "accept 'warmpool fault arm/clear' (for testing and the chaos harness only)");
  bool takeover = false;
  app.add_flag("--takeover", takeover,
               "take over from the warmpoold serving the same socket and instance: it hands over its "
               "listening socket and every resident weights region and parked copy, drains and exits; "
               "this one serves them without reading a file (an upgrade without a reload)");
  bool check = false;
  app.add_flag("--check", check,
               "check the configuration and the model files as a start would, print what would be "
               "served, and exit: 0 when the daemon would start, 1 when it would not");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;

  SetupLogging("warmpoold", "warmpoold", log_level);

  auto fail = [](const Status& s) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 2;
  };
  // The file, then the flags over it: at start and again at every SIGHUP.
  auto assemble = [&]() -> Result<supervisor::Config> {
    supervisor::Config config;
    if (!config_file.empty()) {
      if (Status s = supervisor::LoadConfigFile(config, config_file); !s.ok()) return s;
    }
    if (!socket.empty()) config.socket_path = socket;
    if (!models_dir.empty()) config.models_dir = models_dir;
    if (!backend.empty()) config.backend = *ParseBackend(backend);  // checked by the option above
    if (!instance.empty()) config.instance = instance;
    if (!http_listen.empty()) config.http_listen = http_listen;
    if (!budget.empty()) {
      Result<uint64_t> bytes = ParseSize(budget);
      if (!bytes.ok()) return bytes.status();
      config.budget_bytes = *bytes;
    }
    config.enable_fault_injection = fault_injection;
    config.takeover = takeover;
    supervisor::FinishDefaults(config);
    if (Status s = supervisor::CheckInstanceName(config.instance); !s.ok()) return s;
    return config;
  };
  Result<supervisor::Config> config = assemble();
  if (worker_path.empty()) worker_path = NextToSelf("warmpool-worker");
  if (check) {
    if (!config.ok()) {
      std::printf("warmpoold: the configuration would not start: %s\n", config.status().message().c_str());
      return 1;
    }
    return supervisor::RunCheck(*config, worker_path, stdout);
  }
  if (!config.ok()) return fail(config.status());
  signal(SIGPIPE, SIG_IGN);
  // Requests allocate and free payload-sized buffers; without this glibc hands the heap back to
  // the kernel after each one and faults fresh pages in for the next.
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest glibc accepts

  supervisor::Daemon daemon(std::move(*config), worker_path, assemble);
  if (Status s = daemon.Start(); !s.ok()) return fail(s);
  return daemon.Run();
}
