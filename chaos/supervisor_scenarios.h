// The chaos scenarios that kill or signal the supervisor itself: SIGKILL and a cold restart, SIGKILL
// and a restart from the descriptor store (nothing read from a file after it), and a storm of
// SIGHUPs under traffic with an unchanged registry.
#pragma once

#include <cstddef>

#include "chaos/harness.h"

namespace warmpool::chaos {

void SupervisorKillScenario(Harness& h, Checks& checks, size_t index);
void SupervisorKillWarmScenario(Harness& h, Checks& checks, size_t index);
void ReloadStormScenario(Harness& h, Checks& checks, size_t index);

}  // namespace warmpool::chaos
