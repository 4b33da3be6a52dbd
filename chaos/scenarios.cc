#include "chaos/scenarios.h"

#include <signal.h>

#include <atomic>
#include <map>
#include <chrono>
#include <random>
#include <thread>

#include "chaos/stream_scenario.h"
#include "chaos/supervisor_scenarios.h"
#include "chaos/traffic.h"
#include "ipc/fault_spec.h"

namespace warmpool::chaos {

namespace {

// SIGKILLs the worker serving model (the record's worker); with wait_detached, waits until the
// model is ready with no replica (its weights held by the supervisor alone).
bool KillWorkerOf(Harness& h, const std::string& model, bool wait_detached = true) {
  auto client = h.Connect();
  if (!client.ok()) return false;
  auto ps = (*client)->Ps();
  if (!ps.ok()) return false;
  int slot = -1;
  for (const auto& m : ps->models()) {
    if (m.name() == model) slot = m.worker();
  }
  auto status = (*client)->GetStatus();
  if (slot < 0 || !status.ok() || slot >= status->workers_size()) return false;
  kill(status->workers(slot).pid(), SIGKILL);
  if (!wait_detached) return true;
  for (int i = 0; i < 300; i++) {
    auto now = (*client)->Ps();
    for (const auto& m : now->models()) {
      if (m.name() == model && m.state() == "ready" && m.replicas() == 0) return true;
    }
    Sleep(10);
  }
  return false;
}

// One fault point x one action, with the victim's requests around it.
void FaultScenario(Harness& h, Checks& checks, size_t index, const std::string& point,
                   const std::string& action) {
  const ModelUnderTest& victim = h.victim(index);
  bool hang = action == "hang";
  bool is_load = point.starts_with("load.");
  bool is_unload = point == "unload.mid";
  bool is_attach = point.starts_with("attach.");
  uint32_t restarts = h.TotalRestarts();
  if (!is_load) {
    Status loaded = h.Load(victim.name);
    checks.Expect(loaded.ok(), "victim loaded before the fault", loaded.ToString());
  }
  if (is_attach) {
    // Kill the worker serving the victim: its weights stay with the supervisor, and the next
    // request attaches them to a worker, where the fault waits.
    checks.Expect(KillWorkerOf(h, victim.name), "victim detached from its dead worker");
    restarts = h.TotalRestarts();
  }
  Bystander bystander(h);
  Status armed = h.ArmFault(point, action, victim.name);
  checks.Expect(armed.ok(), "fault armed", armed.message());

  // A one-shot fault's shot is granted to one job by the daemon: it fires once, and the request
  // retried after it succeeds (no INTERNAL: that would take a second crash).
  TrafficSpec spec{&victim, 2, 6, 2, 4, 0, {}, false, index};
  if (hang && !is_load) {
    spec.deadline_ms = 1500;  // the hung request, and those stuck behind it, time out
    spec.allowed = {Code::kDeadlineExceeded};
  }
  if (hang && is_load) spec.allowed = {Code::kDeadlineExceeded};  // a stalled load is slow to retry
  if (point == "park.mid") {
    // The fault fires while the worker copies the weights out: the park fails, the model is
    // dropped instead, and the traffic below loads it again from its file.
    auto client = h.Connect();
    Status parked = client.ok() ? (*client)->Unload(victim.name, /*park=*/true) : client.status();
    checks.Expect(parked.ok(), "the park was answered although its worker died", parked.ToString());
  }
  if (is_unload) {
    Traffic before(h, spec);
    before.Start();
    ExpectTraffic(checks, "victim before the unload", before.Join());
    auto client = h.Connect();
    Status unloaded = client.ok() ? (*client)->Unload(victim.name) : client.status();
    checks.Expect(unloaded.ok(), "unload answered although its worker died", unloaded.ToString());
  }
  Traffic traffic(h, spec);
  traffic.Start();
  TrafficResult result = traffic.Join();
  ExpectTraffic(checks, "victim", result);
  if (hang && point.starts_with("infer.")) {
    checks.Expect(result.errors[Code::kDeadlineExceeded] >= 1, "the hung request got DEADLINE_EXCEEDED");
  }
  bystander.Finish(checks);
  (void)h.ClearFaults();
  Status quiet = h.Quiesce();
  checks.Expect(quiet.ok(), "quiescent after the fault", quiet.message());
  checks.Expect(h.TotalRestarts() > restarts, "the faulted worker was replaced",
                fmt::format("restarts {} -> {}", restarts, h.TotalRestarts()));
  // The victim serves again once the fault is gone.
  TrafficSpec again{&victim, 1, 2, 1, 2, 0, {}, false, index + 1000};
  Traffic after(h, again);
  after.Start();
  ExpectTraffic(checks, "victim after recovery", after.Join());
}

void ReplicaCrashScenario(Harness& h, Checks& checks, size_t index) {
  const ModelUnderTest& victim = h.victim(index);
  auto client = h.Connect();
  if (!client.ok()) return checks.Expect(false, "connect", client.status().ToString());
  checks.Expect((*client)->Load(victim.name, client::LoadOptions{2, std::nullopt}).ok(),
                "victim loaded with 2 replicas");
  auto replicas = [&] {
    auto ps = (*client)->Ps();
    if (!ps.ok()) return 0u;
    for (const auto& m : ps->models()) {
      if (m.name() == victim.name) return m.replicas();
    }
    return 0u;
  };
  for (int i = 0; i < 300 && replicas() != 2; i++) Sleep(10);
  checks.Expect(replicas() == 2, "two replicas attached");
  Bystander bystander(h);
  const uint32_t restarts = h.TotalRestarts();
  Traffic traffic(h, TrafficSpec{&victim, 2, 20, 2, 4, 0, {}, false, index});
  traffic.Start();
  Sleep(20);
  checks.Expect(KillWorkerOf(h, victim.name, /*wait_detached=*/false), "one replica's worker killed");
  ExpectTraffic(checks, "victim while a sibling replica died", traffic.Join());
  bystander.Finish(checks);
  // The sibling may have served all the traffic before the daemon noticed the death: until it
  // has, everything looks quiescent and both replicas still there. Wait for the death to be seen
  // (liveness waits, not timing ones: a loaded machine gets as long as a load would).
  for (int i = 0; i < 1000 && h.TotalRestarts() <= restarts; i++) Sleep(20);
  checks.Expect(h.TotalRestarts() > restarts, "the daemon saw the worker die");
  Status quiet = h.Quiesce();
  checks.Expect(quiet.ok(), "quiescent", quiet.message());
  uint32_t now = replicas();
  for (int i = 0; i < 1000 && now != 2; i++) {
    Sleep(20);
    now = replicas();
  }
  checks.Expect(now == 2, "the respawned worker is a replica again",
                fmt::format("{} replicas; the daemon's log on the model:\n{}", now, h.DaemonLogAbout(victim.name)));
}

// cuda: the process owning device 0's memory is SIGKILLed under traffic (with several devices,
// the others are not touched). Every weight on the device
// dies with it: the supervisor kills the device's workers, retries their requests (no model is
// charged: nothing failed, nothing is refused), starts the owner again and loads the models from
// their files. A parked copy lives in host memory and survives.
void OwnerKillScenario(Harness& h, Checks& checks, size_t index) {
  const ModelUnderTest& victim = h.victim(index);
  Status loaded = h.Load(victim.name);
  checks.Expect(loaded.ok(), "victim loaded", loaded.ToString());
  const pid_t owner = h.OwnerPid();
  checks.Expect(owner > 0, "the device's memory owner runs");
  if (owner <= 0) return;
  Bystander bystander(h);
  Traffic traffic(h, TrafficSpec{&victim, 2, 20, 2, 4, 0, {}, false, index});
  traffic.Start();
  Sleep(20);
  kill(owner, SIGKILL);
  ExpectTraffic(checks, "victim while its device's memory owner died", traffic.Join());
  bystander.Finish(checks);
  pid_t again = -1;
  for (int i = 0; i < 500 && (again <= 0 || again == owner); i++) {
    Sleep(10);
    again = h.OwnerPid();
  }
  checks.Expect(again > 0 && again != owner, "the owner was started again");
  Status quiet = h.Quiesce();
  checks.Expect(quiet.ok(), "quiescent", quiet.message());
  Traffic after(h, TrafficSpec{&victim, 1, 4, 1, 2, 0, {}, false, index});
  after.Start();
  ExpectTraffic(checks, "victim served again from its file", after.Join());
}

void UnparkCrashScenario(Harness& h, Checks& checks, size_t index) {
  const ModelUnderTest& victim = h.victim(index);
  uint32_t restarts = h.TotalRestarts();
  {
    Status loaded = h.Load(victim.name);
    checks.Expect(loaded.ok(), "victim loaded", loaded.ToString());
  }
  auto client = h.Connect();
  if (!client.ok()) return checks.Expect(false, "connect", client.status().ToString());
  checks.Expect((*client)->Unload(victim.name, /*park=*/true).ok(), "victim parked");
  // The unpark copies the host copy into device memory on a worker, which dies before serving:
  // the host copy is still the supervisor's, and the retry unparks again.
  checks.Expect(h.ArmFault("attach.mid", "kill", victim.name).ok(), "fault armed");
  Bystander bystander(h);
  Traffic traffic(h, TrafficSpec{&victim, 2, 6, 2, 4, 0, {}, false, index});
  traffic.Start();
  ExpectTraffic(checks, "victim through a crashed unpark", traffic.Join());
  bystander.Finish(checks);
  (void)h.ClearFaults();
  checks.Expect(h.TotalRestarts() > restarts, "the worker that crashed mid-unpark was replaced");
}

void CrashLoopScenario(Harness& h, Checks& checks, size_t index) {
  const ModelUnderTest& victim = h.victim(index);
  {
    Status loaded = h.Load(victim.name);
    checks.Expect(loaded.ok(), "victim loaded", loaded.ToString());
  }
  checks.Expect(h.ArmFault("infer.mid", "kill", victim.name, 0, 1000).ok(), "fault armed");
  auto client = h.Connect();
  if (!client.ok()) return checks.Expect(false, "connect", client.status().ToString());
  client::Matrix input{1, victim.in_features, std::vector<float>(victim.in_features, 0.5f)};
  bool failed = false;
  for (int i = 0; i < 12 && !failed; i++) {
    auto out = (*client)->Infer(victim.name, input);
    Code code = out.ok() ? Code::kOk : out.status().code();
    checks.Expect(code == Code::kInternal || code == Code::kFailedPrecondition,
                  "each request crashes (INTERNAL) until the model fails (FAILED_PRECONDITION)",
                  out.status().ToString());
    failed = code == Code::kFailedPrecondition;
  }
  checks.Expect(failed, "crash loop ended in state failed");
  (void)h.ClearFaults();
  auto ps = (*client)->Ps();
  int64_t retry_ms = 0;
  bool listed = false;
  for (const auto& m : ps->models()) {
    if (m.name() != victim.name) continue;
    listed = m.state() == "failed" && m.last_error().find("crashed its worker") != std::string::npos;
    retry_ms = m.retry_in_ms();
  }
  checks.Expect(listed && retry_ms > 0, "ps shows failed with the reason and a cooldown");
  auto early = (*client)->Infer(victim.name, input);
  checks.Expect(!early.ok() && early.status().code() == Code::kFailedPrecondition &&
                    early.status().message().find("retried in") != std::string::npos,
                "refused during the cooldown, saying when it retries", early.status().ToString());
  Sleep(static_cast<int>(retry_ms) + 50);
  auto late = (*client)->Infer(victim.name, input);
  checks.Expect(late.ok(), "served again after the cooldown", late.status().ToString());
}

void MalformedModelsScenario(Harness& h, Checks& checks, size_t) {
  uint32_t restarts = h.TotalRestarts();
  Bystander bystander(h);
  auto client = h.Connect();
  if (!client.ok()) return checks.Expect(false, "connect", client.status().ToString());
  for (const std::string& name : h.broken()) {
    client::Matrix input{1, 32, std::vector<float>(32, 1.0f)};
    auto out = (*client)->Infer(name, input);
    checks.Expect(!out.ok() && out.status().code() == Code::kFailedPrecondition &&
                      out.status().message().find(name) != std::string::npos,
                  fmt::format("{}: FAILED_PRECONDITION naming the model", name),
                  out.status().ToString());
  }
  auto models = (*client)->Models();
  int failed = 0;
  for (const auto& m : models->models()) {
    for (const std::string& name : h.broken()) failed += m.name() == name && m.state() == "failed" && !m.last_error().empty();
  }
  checks.Expect(failed == static_cast<int>(h.broken().size()), "models lists them failed with the reason");
  bystander.Finish(checks);
  checks.Expect(h.TotalRestarts() == restarts, "no worker crashed over a bad file");
}

void BudgetScenario(Harness& h, Checks& checks, size_t index) {
  std::vector<std::unique_ptr<Traffic>> traffic;
  for (const ModelUnderTest& m : h.fillers()) {
    traffic.push_back(std::make_unique<Traffic>(
        h, TrafficSpec{&m, 2, 8, 1, 8, 10000, {Code::kDeadlineExceeded}, false, index}));
    traffic.back()->Start();
  }
  auto client = h.Connect();
  // Every device's peak against its own budget (0 while not seen).
  std::vector<std::pair<uint64_t, uint64_t>> peaks;
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    auto c = h.Connect();
    while (c.ok() && !done) {
      auto s = (*c)->GetStatus();
      if (s.ok()) {
        peaks.resize(std::max<size_t>(peaks.size(), s->devices_size()));
        for (int d = 0; d < s->devices_size(); d++) {
          peaks[d].first = std::max(peaks[d].first, s->devices(d).used_bytes());
          peaks[d].second = s->devices(d).budget_bytes();
        }
      }
      Sleep(2);
    }
  });
  for (auto& t : traffic) ExpectTraffic(checks, "filler", t->Join());
  done = true;
  watcher.join();
  bool within = !peaks.empty();
  std::string seen;
  for (size_t d = 0; d < peaks.size(); d++) {
    within = within && peaks[d].second != 0 && peaks[d].first <= peaks[d].second;
    seen += fmt::format("{}device {}: peak {} of {}", d == 0 ? "" : "; ", d, peaks[d].first, peaks[d].second);
  }
  checks.Expect(within, "no device's budget was ever exceeded", seen);
}

void DisconnectStormScenario(Harness& h, Checks& checks, size_t index) {
  Bystander bystander(h);
  const ModelUnderTest& victim = h.victim(index);
  for (int i = 0; i < 40; i++) {
    auto c = h.Connect();
    if (!c.ok()) continue;
    for (int k = 0; k < 5; k++) {
      const ModelUnderTest& m = k % 2 ? victim : h.bystander();
      (void)(*c)->SendInfer(
          m.name, client::Matrix{8, m.in_features, std::vector<float>(8 * m.in_features, 0.25f)});
    }
    // Destroyed without reading a reply: the connection vanishes mid-request.
  }
  bystander.Finish(checks);
}

}  // namespace

std::vector<Scenario> AllScenarios() {
  std::vector<Scenario> all;
  for (const char* point : ipc::kFaultPoints) {
    for (const char* action : {"kill", "segv", "hang"}) {
      std::string p = point, a = action;
      all.push_back({p + " x " + a, false, [p, a](Harness& h, Checks& c, size_t i) {
                       FaultScenario(h, c, i, p, a);
                     }});
    }
  }
  all.push_back({"replica crash while its sibling serves", false, ReplicaCrashScenario});
  all.push_back({"crash during unpark", true, UnparkCrashScenario});
  all.push_back({"device memory owner SIGKILL", true, OwnerKillScenario, /*cuda_only=*/true});
  all.push_back({"crash loop to failed, cooldown, recovery", false, CrashLoopScenario});
  all.push_back({"malformed model files", true, MalformedModelsScenario});
  all.push_back({"budget exhaustion under load", true, BudgetScenario});
  all.push_back({"client disconnect storm", false, DisconnectStormScenario});
  all.push_back({"supervisor SIGKILL and restart", true, SupervisorKillScenario});
  all.push_back({"supervisor SIGKILL and restart with the descriptor store", true, SupervisorKillWarmScenario});
  all.push_back({"SIGHUP storm under traffic", true, ReloadStormScenario});
  all.push_back({"a stream's worker SIGKILLed at a random token", true, StreamResumeScenario});
  return all;
}

}  // namespace warmpool::chaos
