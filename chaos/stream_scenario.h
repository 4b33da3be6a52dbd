// The chaos scenario for a language model's streams: a worker SIGKILLed at a random token of a
// stream, which the daemon resumes on a respawned worker after the tokens sent. The client's
// stream must be the undisturbed one, token for token and byte for byte, its chunks numbered
// without a gap; the bystander is served throughout.
#pragma once

#include <cstddef>

#include "chaos/harness.h"

namespace warmpool::chaos {

void StreamResumeScenario(Harness& h, Checks& checks, size_t index);

}  // namespace warmpool::chaos
