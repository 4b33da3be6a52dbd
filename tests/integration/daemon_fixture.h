// Integration tests run the real binaries (warmpoold, warmpool-worker, warmpool, warmpool-mkmodel)
// in a temporary directory, one daemon per test with its own instance name and socket. TearDown
// stops the daemon with SIGTERM and checks the global invariants: the daemon exits 0 (it validates
// the segment at shutdown), the segment and the socket are gone, and no worker outlives it.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/client.h"
#include "common/status.h"
#include "launch/daemon_process.h"
#include "launch/service_manager_double.h"
#include "tests/text.h"

namespace warmpool::testing {

using ::warmpool::testing::Contains;  // tests/text.h

std::string BinDir();

// Runs a program to completion; returns its exit status (-1 if it could not run).
int RunProgram(const std::vector<std::string>& argv, std::string* out = nullptr,
               std::string* err = nullptr, const std::string& input = "");

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Writes config.toml (extra_toml appended) and starts warmpoold; waits until it answers.
  void StartDaemon(const std::string& extra_toml = "", std::vector<std::string> extra_args = {});
  // Starts warmpoold with no config file and no flags but the socket and instance (which a test
  // must isolate): the embedded defaults, with ./models of the working directory.
  void StartDaemonWithDefaults();
  // Starts warmpoold with these flags besides --socket and --instance, and waits until it answers
  // with every worker idle.
  void Launch(std::vector<std::string> args);
  // Starts a whole command line instead (a program that starts warmpoold on socket_ itself).
  void LaunchCommand(std::vector<std::string> argv);
  // Sends SIGTERM and waits; returns the exit status (the daemon validates the segment on exit).
  int StopDaemon();
  // Waits for a daemon already told to stop; returns its exit status as StopDaemon does.
  int WaitForExit();
  // SIGKILL, as a crash would: the segment and the socket stay behind.
  void KillDaemon();
  pid_t DaemonPid() const { return daemon_ ? daemon_->pid() : -1; }
  // A dense model under models/ via warmpool-mkmodel; returns its path.
  std::string MakeModel(const std::string& name, const std::string& layers,
                        const std::string& activation = "relu", const std::string& dtype = "f32",
                        int seed = 1);
  // Device bytes the daemon will account for a dense model file (weights + workspace).
  static uint64_t AccountedBytes(const std::string& path);

  std::unique_ptr<client::Client> Connect();
  // warmpool CLI against this daemon.
  int Cli(const std::vector<std::string>& args, std::string* out = nullptr,
          std::string* err = nullptr, const std::string& input = "");
  // Waits until nothing is in flight or queued, then validates the segment read-only.
  void ExpectQuiescentAndValid();
  std::vector<pid_t> WorkerPids();
  std::string DaemonLog() const;

  std::string dir_;
  std::string models_dir_;
  std::string socket_;
  std::string instance_;
  std::unique_ptr<launch::DaemonProcess> daemon_;
  std::vector<pid_t> seen_workers_;
  // KEY=VALUE set in the daemon's environment by Launch (e.g. NOTIFY_SOCKET).
  std::vector<std::string> launch_env_;
  // When set, Launch starts the daemon under this stand-in for systemd (NOTIFY_SOCKET, and the
  // descriptors it keeps passed as LISTEN_FDS).
  std::unique_ptr<launch::ServiceManagerDouble> service_manager_;
  // When not 0, the daemon's limit of open files (RLIMIT_NOFILE), set before it starts.
  uint64_t launch_nofile_ = 0;
};

// The expected output of a dense model computed in this process with the same engine library.
client::Matrix ReferenceInfer(const std::string& path, const client::Matrix& input);
client::Matrix RandomMatrix(uint32_t rows, uint32_t cols, uint64_t seed);
// Sends an infer request without waiting for its reply (pipelined); returns its request id.
Result<uint64_t> SendInfer(client::Client& c, const std::string& model, const client::Matrix& input,
                           uint32_t deadline_ms = 0);
// The reply is a successful inference whose output matches expected.
void ExpectInferReply(const Result<v1::Envelope>& reply, const client::Matrix& expected);
void ExpectNear(const client::Matrix& expected, const client::Matrix& actual, float tolerance = 1e-5f);

}  // namespace warmpool::testing
