// The harness's scenarios. Each one drives traffic and faults against the daemon and records what it
// checked; the runner then checks the quiescent invariants and prints one row.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chaos/harness.h"

namespace warmpool::chaos {

struct Scenario {
  std::string name;
  bool needs_own_daemon = false;
  std::function<void(Harness&, Checks&, size_t index)> run;
  bool cuda_only = false;  // skipped on the host backend
};

std::vector<Scenario> AllScenarios();

// Randomized faults and traffic for `seconds`, checking the invariants every few seconds.
void Soak(Harness& harness, Checks& checks, int seconds, uint64_t seed);

}  // namespace warmpool::chaos
