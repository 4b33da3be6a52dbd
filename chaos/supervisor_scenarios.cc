#include "chaos/supervisor_scenarios.h"

#include <signal.h>

#include <map>
#include <string>

#include "chaos/traffic.h"

namespace warmpool::chaos {

void SupervisorKillScenario(Harness& h, Checks& checks, size_t) {
  Traffic traffic(h, TrafficSpec{&h.bystander(), 2, 0, 2, 2, 0, {Code::kUnavailable}, true, 5});
  traffic.Start();
  Sleep(100);
  h.Kill(checks);
  traffic.Stop();
  traffic.Join();  // replies were lost with the supervisor: only the restart is judged
  h.Restart(checks);
  Traffic after(h, TrafficSpec{&h.bystander(), 2, 5, 2, 2, 0, {}, false, 6});
  after.Start();
  ExpectTraffic(checks, "served after the restart", after.Join());
}

// The same under the stand-in for systemd's descriptor store, with the victim ready and another
// model parked: after the restart both are served from the weights kept, none is read from its file
// again, and the traffic after it is answered correctly.
void SupervisorKillWarmScenario(Harness& h, Checks& checks, size_t index) {
  const ModelUnderTest& victim = h.victim(index);
  const ModelUnderTest& parked = h.victim(index + 1);
  for (const ModelUnderTest* m : {&victim, &parked, &h.bystander()}) {
    Status loaded = h.Load(m->name);
    checks.Expect(loaded.ok(), "loaded before the kill: " + m->name, loaded.ToString());
  }
  {
    auto client = h.Connect();
    bool ok = client.ok() && (*client)->Unload(parked.name, /*park=*/true).ok();
    checks.Expect(ok, "parked before the kill: " + parked.name);
  }
  Traffic traffic(h, TrafficSpec{&victim, 2, 0, 2, 2, 0, {Code::kUnavailable}, true, index});
  traffic.Start();
  checks.Expect(h.WaitUntilKept({victim.name, h.bystander().name}, {parked.name}),
                "the descriptor store keeps the ready models' weights and the parked copy");
  h.Kill(checks);
  traffic.Stop();
  traffic.Join();  // replies were lost with the supervisor: only the restart is judged
  h.Restart(checks, /*warm=*/true);
  std::map<std::string, std::string> states;
  if (auto client = h.Connect(); client.ok()) {
    if (auto ps = (*client)->Ps(); ps.ok()) {
      for (const auto& m : ps->models()) states[m.name()] = m.state();
    }
  }
  checks.Expect(states[victim.name] == "ready", "the victim is ready at once after the restart",
                states[victim.name]);
  checks.Expect(states[parked.name] == "parked", "the parked model is still parked", states[parked.name]);
  Traffic after(h, TrafficSpec{&victim, 2, 5, 2, 2, 0, {}, false, index + 7});
  after.Start();
  ExpectTraffic(checks, "victim served after the restart", after.Join());
  Bystander bystander(h);
  Status unparked = h.Load(parked.name);
  checks.Expect(unparked.ok(), "the parked model unparks from its kept copy", unparked.ToString());
  bystander.Finish(checks);
  for (const ModelUnderTest* m : {&victim, &parked, &h.bystander()}) {
    const int64_t loads = h.FileLoads(m->name);
    checks.Expect(loads == 0, "nothing read from a file after the restart: " + m->name,
                  loads < 0 ? std::string("the model is not in the segment") : fmt::format("{} loads from the file", loads));
  }
}

// SIGHUP after SIGHUP under traffic, with a registry that did not change: nothing is unloaded or
// re-registered, nothing is lost, no worker restarts.
void ReloadStormScenario(Harness& h, Checks& checks, size_t index) {
  const ModelUnderTest& victim = h.victim(index);
  uint32_t restarts = h.TotalRestarts();
  {
    Status loaded = h.Load(victim.name);
    checks.Expect(loaded.ok(), "victim loaded before the reloads", loaded.ToString());
  }
  Bystander bystander(h);
  Traffic traffic(h, TrafficSpec{&victim, 2, 0, 2, 4, 0, {}, false, index});
  traffic.Start();
  pid_t supervisor = h.SupervisorPid();
  checks.Expect(supervisor > 0, "supervisor pid from the segment");
  for (int i = 0; i < 10 && supervisor > 0; i++) {
    kill(supervisor, SIGHUP);
    Sleep(20);
  }
  Sleep(300);  // the status tick retires what a reload marked: here, nothing
  traffic.Stop();
  ExpectTraffic(checks, "victim", traffic.Join());
  bystander.Finish(checks);
  bool ready = false;
  if (auto client = h.Connect(); client.ok()) {
    if (auto ps = (*client)->Ps(); ps.ok()) {
      for (const auto& m : ps->models()) ready = ready || (m.name() == victim.name && m.state() == "ready");
    }
  }
  checks.Expect(ready, "the victim stayed loaded through every reload");
  checks.Expect(h.TotalRestarts() == restarts, "no worker restarted");
}

}  // namespace warmpool::chaos
