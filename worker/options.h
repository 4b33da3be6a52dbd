// How warmpoold started this worker: its command line (worker/main.cc), written and parsed by
// ipc/child_arguments.h.
#pragma once

#include "ipc/child_arguments.h"

namespace warmpool::worker {

using WorkerOptions = ipc::WorkerArguments;

}  // namespace warmpool::worker
