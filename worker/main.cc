// warmpool-worker: started by warmpoold, never by hand. Its exit status is read by the supervisor
// (ipc/exit_status.h): kChildFatal means "fatal configuration, do not respawn"; any other exit
// (kChildFailed for a start that may succeed later) is a crash the supervisor recovers from.
#include <malloc.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "common/command_line.h"
#include <spdlog/spdlog.h>

#include "common/logging.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/dense_cpu.h"
#include "engines/dense_gpu.h"
#include "ipc/exit_status.h"
#include "worker/worker.h"

int main(int argc, char** argv) {
  warmpool::worker::WorkerOptions options;
  CLI::App app{"warmpool worker process; started by warmpoold, not meant to be run by hand"};
  warmpool::ipc::DeclareWorkerArguments(app, options);
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;

  // Die with the supervisor. The parent may have died before prctl took effect: check after.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (options.parent != 0 && getppid() != options.parent) return warmpool::ipc::kChildStopped;
  signal(SIGPIPE, SIG_IGN);
  // Requests allocate and free payload-sized buffers; without this glibc hands the heap back to
  // the kernel after each one and faults fresh pages in for the next.
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // the largest glibc accepts

  warmpool::SetupLogging("worker", fmt::format("worker[{}]", options.slot), "info");
  warmpool::dense::SetGpuOptions({options.tf32});
  warmpool::dense::SetCpuThreads(static_cast<int>(options.threads));
  if (options.backend != warmpool::Backend::kHost) warmpool::dense::PreloadGpuModule();  // before the hello

  warmpool::WarmBuiltinEngines();  // before the hello: the first step of a model attached is not slowed
  warmpool::worker::Worker worker(options);
  if (warmpool::Status s = worker.Start(); !s.ok()) {
    spdlog::critical("cannot start: {}", s.ToString());
    // Out of device memory for a context, or a driver error, may pass: the supervisor starts it
    // again later. Anything else is configuration, which starting again cannot fix.
    const bool transient = s.code() == warmpool::Code::kResourceExhausted || s.code() == warmpool::Code::kInternal;
    return transient ? warmpool::ipc::kChildFailed : warmpool::ipc::kChildFatal;
  }
  return worker.Run();
}
