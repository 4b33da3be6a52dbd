// warmpool-chaos: the fault-injection harness. It proves warmpool's promises against a daemon it
// starts itself (default) or against a live one, by injecting faults under traffic and checking the
// design's seven invariants after every scenario.
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <CLI/CLI.hpp>

#include "common/command_line.h"

#include "common/paths.h"

#include "chaos/harness.h"
#include "chaos/scenarios.h"

namespace {

// "90", "90s", "2m", "1h" -> seconds; -1 when malformed.
int ParseDuration(const std::string& text) {
  if (text.empty()) return -1;
  size_t pos = 0;
  int value = 0;
  try {
    value = std::stoi(text, &pos);
  } catch (...) {
    return -1;
  }
  std::string unit = text.substr(pos);
  if (unit.empty() || unit == "s") return value;
  if (unit == "m") return value * 60;
  if (unit == "h") return value * 3600;
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace warmpool::chaos;
  CLI::App app{
      "warmpool-chaos: inject faults into warmpool workers under traffic and check that every "
      "request is answered exactly once, results are right, the in-flight table empties, byte "
      "accounting and the LRU index stay valid, other models keep being served, and no process, "
      "fd or segment leaks.\n\n"
      "By default it starts its own warmpoold (with --enable-fault-injection) in a fresh temporary "
      "directory with models it writes, runs every scenario, and stops it.\n\n"
      "Against a live daemon: start warmpoold with --enable-fault-injection, then\n"
      "  warmpool-chaos --socket PATH --instance NAME --victim MODEL --bystander MODEL\n"
      "The victim is the model faults hit (it may end the run failed, in cooldown); the bystander "
      "must keep serving. Scenarios that must restart or reconfigure the daemon are skipped. Run it "
      "as the daemon's user (or root) so the segment and /proc checks can read what they need. "
      "Never point it at a production daemon: it kills workers on purpose."};
  Options options;
  std::vector<std::string> only;
  bool list = false;
  bool no_scenarios = false;
  std::string soak;
  uint64_t seed = 1;
  app.add_option("--socket", options.socket, "socket of a live daemon (default: start our own)");
  app.add_option("--instance", options.instance, "instance name of that daemon (for its segment)");
  app.add_option("--victim", options.victim, "live daemon: model to inject faults into");
  app.add_option("--bystander", options.bystander, "live daemon: model that must keep serving");
  app.add_option("--daemon", options.daemon_path, "warmpoold to start (default: $WARMPOOL_BIN_DIR/warmpoold, else next to this binary)");
  app.add_option("--backend", options.backend, "own daemon: warmpoold --backend (auto, host or cuda)")
      ->check(CLI::IsMember({"auto", "host", "cuda"}));
  app.add_option("--scenario", only, "run scenarios whose name contains this (repeatable)");
  app.add_flag("--list", list, "list the scenarios and exit");
  app.add_flag("--no-scenarios", no_scenarios, "run no scenario: with --soak, the soak alone");
  app.add_option("--soak", soak, "after the scenarios, run randomized faults and traffic this long (e.g. 60s, 5m)");
  app.add_option("--seed", seed, "seed of the soak (printed with any failure)");
  app.add_flag("--verbose", options.verbose, "print every check, not only failures");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;

  std::vector<Scenario> scenarios = AllScenarios();
  if (list) {
    for (const Scenario& s : scenarios) std::printf("%s%s\n", s.name.c_str(), s.needs_own_daemon ? "  (own daemon only)" : "");
    return 0;
  }
  int soak_seconds = 0;
  if (!soak.empty() && (soak_seconds = ParseDuration(soak)) < 0) {
    std::fprintf(stderr, "error: INVALID_ARGUMENT: --soak \"%s\" is not a duration like 60s or 5m\n", soak.c_str());
    return 2;
  }
  if (!options.socket.empty() &&
      (options.instance.empty() || options.victim.empty() || options.bystander.empty())) {
    std::fprintf(stderr, "error: INVALID_ARGUMENT: with --socket also pass --instance, --victim and --bystander\n");
    return 2;
  }
  if (options.daemon_path.empty()) {
    // As the integration tests: WARMPOOL_BIN_DIR names other programs to run (the sanitizer pass).
    const char* dir = std::getenv("WARMPOOL_BIN_DIR");
    options.daemon_path = dir != nullptr && *dir != '\0' ? std::string(dir) + "/warmpoold"
                                                          : warmpool::NextToSelf("warmpoold");
  }
  signal(SIGPIPE, SIG_IGN);

  Harness harness(options);
  if (warmpool::Status s = harness.Start(); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  int passed = 0, failed = 0;
  auto report = [&](const std::string& name, const Checks& checks, double seconds) {
    bool ok = checks.ok();
    (ok ? passed : failed)++;
    std::printf("%s  %-44s %5.1fs  %zu checks", ok ? "PASS" : "FAIL", name.c_str(), seconds,
                checks.passed.size() + checks.failed.size());
    std::printf("\n");
    if (options.verbose || !ok) {
      for (const std::string& c : checks.passed) std::printf("        ok    %s\n", c.c_str());
    }
    for (const std::string& c : checks.failed) std::printf("        FAIL  %s\n", c.c_str());
    if (!ok) {
      const std::string again = name.rfind("soak ", 0) == 0
                                    ? fmt::format("--no-scenarios --soak {}s --seed {}", soak_seconds, seed)
                                    : fmt::format("--scenario '{}'", name);
      std::printf("        reproduce: warmpool-chaos %s\n", again.c_str());
      std::printf("%s", harness.SegmentDump().c_str());
      harness.KeepDirectory();
    }
    std::fflush(stdout);
  };

  size_t index = 0;
  for (const Scenario& scenario : scenarios) {
    index++;
    bool selected = only.empty() && !no_scenarios;
    for (const std::string& o : only) selected = selected || scenario.name.find(o) != std::string::npos;
    if (!selected) continue;
    if (scenario.needs_own_daemon && !harness.owns_daemon()) {
      std::printf("SKIP  %-44s (needs its own daemon)\n", scenario.name.c_str());
      continue;
    }
    if (scenario.cuda_only && harness.Backend() != "cuda") {
      std::printf("SKIP  %-44s (cuda backend only)\n", scenario.name.c_str());
      continue;
    }
    auto start = std::chrono::steady_clock::now();
    Checks checks;
    scenario.run(harness, checks, index);
    (void)harness.ClearFaults();
    harness.CheckQuiescent(checks);
    report(scenario.name, checks,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (soak_seconds > 0) {
    auto start = std::chrono::steady_clock::now();
    Checks checks;
    Soak(harness, checks, soak_seconds, seed);
    harness.CheckQuiescent(checks);
    report(fmt::format("soak {}s seed {}", soak_seconds, seed), checks,
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (harness.owns_daemon()) {
    Checks checks;
    harness.Stop(&checks);
    report("daemon stop", checks, 0);
  }
  if (failed > 0 && !harness.directory().empty()) {
    std::printf("daemon log and models kept in %s\n", harness.directory().c_str());
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
