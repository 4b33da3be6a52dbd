// The fixture of the crash-isolation tests (recovery_test.cc, recovery_loops_test.cc): a daemon
// that accepts injected faults, the CLI's JSON, and waits for workers to settle.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {

using json = nlohmann::json;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

inline const std::vector<std::string> kFaults = {"--enable-fault-injection"};
// Respawn quickly so that tests do not wait on the production backoff.
inline constexpr const char* kFastRespawn = "[recovery]\nrespawn_min_ms = 20\nrespawn_max_ms = 200\n";

inline int64_t ElapsedMs(Clock::time_point since) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - since).count();
}

// Polls until done() holds or timeout_ms pass; returns whether it held.
inline bool WaitFor(const std::function<bool()>& done, int timeout_ms = 3000) {
  auto start = Clock::now();
  while (ElapsedMs(start) < timeout_ms) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return done();
}

// The entry named `name` in a JSON array of objects (null when absent).
inline json Named(const json& list, const std::string& name) {
  if (!list.is_array()) return nullptr;
  for (const json& e : list) {
    if (e.value("name", "") == name) return e;
  }
  return nullptr;
}

class RecoveryTest : public DaemonTest {
 protected:
  // Runs the CLI, expects exit 0 and returns its stdout parsed as JSON.
  json CliJson(const std::vector<std::string>& args) {
    std::string out, err;
    int rc = Cli(args, &out, &err);
    EXPECT_EQ(rc, 0) << err;
    json doc = json::parse(out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(doc.is_discarded()) << out;
    return doc;
  }

  void Arm(const std::vector<std::string>& spec) {
    std::vector<std::string> args = {"fault", "arm"};
    args.insert(args.end(), spec.begin(), spec.end());
    std::string out, err;
    ASSERT_EQ(Cli(args, &out, &err), 0) << err;
    EXPECT_TRUE(Contains(out, "armed")) << out;
  }

  // `warmpool fault clear`: returns how many faults it reports as cleared (-1 on failure).
  int ClearFaults() {
    std::string out, err;
    int rc = Cli({"fault", "clear"}, &out, &err);
    EXPECT_EQ(rc, 0) << err;
    int n = -1;
    if (rc == 0 && std::sscanf(out.c_str(), "%d fault(s) cleared", &n) != 1) n = -1;
    EXPECT_GE(n, 0) << out;
    return n;
  }

  // Waits until no worker is starting or dead (respawns done); returns the last status.
  v1::StatusReply SettledStatus(client::Client& c) {
    v1::StatusReply last;
    WaitFor([&] {
      auto s = c.GetStatus();
      if (!s.ok()) return false;
      last = *s;
      for (const auto& w : s->workers()) {
        if (w.state() == "starting" || w.state() == "dead") return false;
      }
      return true;
    });
    WorkerPids();  // remember the respawned workers: TearDown checks that they are gone too
    return last;
  }

  static uint32_t TotalRestarts(const v1::StatusReply& s) {
    uint32_t n = 0;
    for (const auto& w : s.workers()) n += w.restarts();
    return n;
  }

  void ExpectInferCorrect(client::Client& c, const std::string& model, const std::string& path,
                          uint64_t seed = 7) {
    client::Matrix input = RandomMatrix(3, 8, seed);
    auto out = c.Infer(model, input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(ReferenceInfer(path, input), *out);
  }
};

}  // namespace warmpool::testing
