// warmpool-sim: the deterministic simulator of the supervisor's core (sim/simulator.h).
//
//   warmpool-sim                          200 seeds from 1, 5000 events each
//   warmpool-sim --seed 42 --events 100000
//   warmpool-sim --seed 42 --trace         replay one seed, printing every event and action
//   warmpool-sim --regressions sim/regressions.txt   the seeds that found defects
//
// Exit status 1 when an invariant broke: the seed, the invariant and the last events are printed,
// and `--seed S` (with the same --events) replays it exactly.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/command_line.h"

#include "sim/simulator.h"

int main(int argc, char** argv) {
  CLI::App app{"warmpool-sim: drive the supervisor's core through simulated clients, workers, "
               "file changes and faults from a seed, checking its invariants after every event."};
  uint64_t seed = 1, seeds = 200, events = 5000;
  bool trace = false;
  std::string regressions;
  auto* seed_opt = app.add_option("--seed", seed, "first seed (with --seeds 1 unless --seeds is given)");
  auto* seeds_opt = app.add_option("--seeds", seeds, "how many seeds, from --seed on (default 200)");
  app.add_option("--events", events, "core events per seed before the stop (default 5000)");
  app.add_flag("--trace", trace, "print every event and action");
  app.add_option("--regressions", regressions,
                 "a file of \"SEED EVENTS # what it found\" lines: replay each instead");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (seed_opt->count() > 0 && seeds_opt->count() == 0) seeds = 1;
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // seed, events
  if (!regressions.empty()) {
    std::ifstream in(regressions);
    if (!in) {
      std::fprintf(stderr, "error: INVALID_ARGUMENT: cannot read %s\n", regressions.c_str());
      return 2;
    }
    for (std::string line; std::getline(in, line);) {
      line = line.substr(0, line.find('#'));
      std::istringstream fields(line);
      uint64_t s = 0, e = 0;
      if (fields >> s >> e) runs.emplace_back(s, e);
    }
  } else {
    for (uint64_t s = seed; s < seed + seeds; s++) runs.emplace_back(s, events);
  }
  seeds = runs.size();

  auto start = std::chrono::steady_clock::now();
  uint64_t total_events = 0, total_requests = 0, total_ok = 0, total_deaths = 0, total_restarts = 0,
           total_adopted = 0, total_kv_waits = 0, total_preemptions = 0, total_device_caches = 0, total_pool_copies = 0;
  uint64_t failed = 0;
  for (auto [s, run_events] : runs) {
    warmpool::sim::Options options;
    options.seed = s;
    options.events = run_events;
    options.trace = trace;
    warmpool::sim::Outcome out = warmpool::sim::Run(options);
    total_events += out.events;
    total_requests += out.requests;
    total_ok += out.replies_ok;
    total_deaths += out.worker_deaths;
    total_restarts += out.restarts;
    total_adopted += out.adopted;
    total_kv_waits += out.kv_waits;
    total_preemptions += out.preemptions;
    total_device_caches += out.device_caches;
    total_pool_copies += out.pool_copies;
    if (out.ok) continue;
    failed++;
    std::printf("seed %llu FAILED %s\n", static_cast<unsigned long long>(s), out.failure.c_str());
    if (!trace) {
      std::printf("last events of seed %llu:\n", static_cast<unsigned long long>(s));
      for (const std::string& line : out.trace) std::printf("  %s\n", line.c_str());
    }
    std::printf("replay: warmpool-sim --seed %llu --events %llu --trace\n",
                static_cast<unsigned long long>(s), static_cast<unsigned long long>(run_events));
  }
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%llu seeds, %llu events (%.0f events/s), %llu requests, %llu answers checked, %llu "
              "worker deaths, %llu supervisor restarts (%llu models adopted warm), %llu generations sent "
              "back for KV room (%llu of them preempted), %llu KV caches in device memory (%llu copied out to park)\n",
              static_cast<unsigned long long>(seeds), static_cast<unsigned long long>(total_events),
              total_events / std::max(seconds, 1e-9), static_cast<unsigned long long>(total_requests),
              static_cast<unsigned long long>(total_ok), static_cast<unsigned long long>(total_deaths),
              static_cast<unsigned long long>(total_restarts), static_cast<unsigned long long>(total_adopted),
              static_cast<unsigned long long>(total_kv_waits), static_cast<unsigned long long>(total_preemptions),
              static_cast<unsigned long long>(total_device_caches), static_cast<unsigned long long>(total_pool_copies));
  std::printf("%llu passed, %llu failed\n", static_cast<unsigned long long>(seeds - failed),
              static_cast<unsigned long long>(failed));
  return failed == 0 ? 0 : 1;
}
