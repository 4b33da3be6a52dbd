// The soak (scenarios.h): randomized faults and traffic against every kind of model for a while,
// the quiescent invariants checked every few rounds.
#include <signal.h>

#include <chrono>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "chaos/scenarios.h"
#include "chaos/traffic.h"
#include "ipc/fault_spec.h"

namespace warmpool::chaos {

void Soak(Harness& h, Checks& checks, int seconds, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const char* actions[] = {"kill", "segv", "abort", "exit:1", "delay:50", "kill", "hang"};
  std::set<Code> allowed = {Code::kDeadlineExceeded, Code::kInternal, Code::kFailedPrecondition};
  auto start = std::chrono::steady_clock::now();
  // cuda: the device's memory owner dies now and then too (never twice within 15 s: an owner that
  // keeps dying young has its allocations refused, by design).
  const bool cuda = h.Backend() == "cuda";
  auto owner_killed = start - std::chrono::seconds(15);
  size_t owner_kills = 0;
  size_t round = 0;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(seconds)) {
    round++;
    // A few faults on victims of this soak (indices past the scenarios' victims).
    for (int f = 0; f < 3; f++) {
      const ModelUnderTest& v = h.victim(40 + pick(8));
      (void)h.ArmFault(ipc::kFaultPoints[pick(std::size(ipc::kFaultPoints))],
                       actions[pick(std::size(actions))], v.name, 1 + pick(3), 1);
    }
    std::vector<std::unique_ptr<Traffic>> traffic;
    for (int t = 0; t < 4; t++) {
      const ModelUnderTest* m = &h.victim(40 + pick(8));
      if (pick(3) == 0) m = &h.fillers()[pick(h.fillers().size())];
      traffic.push_back(std::make_unique<Traffic>(
          h, TrafficSpec{m, 1, 4 + static_cast<int>(pick(6)), 1 + static_cast<int>(pick(3)), 2, 2500,
                         allowed, false, rng()}));
      traffic.back()->Start();
    }
    Traffic steady(h, TrafficSpec{&h.bystander(), 1, 10, 2, 2, 0, {Code::kDeadlineExceeded}, false, rng()});
    steady.Start();
    if (pick(2) == 0) (void)h.Unload(h.victim(40 + pick(8)).name);
    if (cuda && pick(3) == 0 && std::chrono::steady_clock::now() - owner_killed > std::chrono::seconds(15)) {
      if (pid_t owner = h.OwnerPid(static_cast<uint32_t>(pick(h.DeviceCount()))); owner > 0) {
        kill(owner, SIGKILL);
        owner_killed = std::chrono::steady_clock::now();
        owner_kills++;
      }
    }
    if (pick(3) == 0) {
      for (int i = 0; i < 5; i++) {
        auto c = h.Connect();
        if (c.ok()) {
          (void)(*c)->SendInfer(h.bystander().name,
                                client::Matrix{1, h.bystander().in_features,
                                               std::vector<float>(h.bystander().in_features, 0.1f)});
        }
      }
    }
    for (auto& t : traffic) {
      TrafficResult r = t->Join();
      if (!r.problems.empty()) ExpectTraffic(checks, fmt::format("soak round {} traffic", round), r);
    }
    TrafficResult s = steady.Join();
    if (!s.problems.empty()) ExpectTraffic(checks, fmt::format("soak round {} bystander", round), s);
    if (round % 4 == 0) {
      (void)h.ClearFaults();
      Checks quiet;
      h.CheckQuiescent(quiet);
      for (const std::string& f : quiet.failed) checks.failed.push_back(fmt::format("soak round {}: {}", round, f));
    }
  }
  (void)h.ClearFaults();
  checks.passed.push_back(fmt::format("{} soak rounds{}", round,
                                      cuda ? fmt::format(", {} owner kills", owner_kills) : std::string()));
}

}  // namespace warmpool::chaos
