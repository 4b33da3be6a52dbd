// warmpool-bench --restart: what a restart of warmpoold costs a warm model. A private warmpoold
// serves one dense model of --model-mib MiB under a stand-in for systemd's descriptor store
// (launch/service_manager_double.h). Each iteration SIGKILLs the daemon and starts a new one, and
// measures from the fork of the new warmpoold (a) until the model is listed ready and (b) until
// the first inference on it succeeds, once with the store (the weights kept are adopted) and once
// with the store emptied (the model loads again, from the page cache). For scale, in the same run:
// the model's steady inference time and a read of the file from the page cache (`cat`). It prints
// the figures and asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct RestartOptions {
  std::string daemon;            // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t iterations = 5;       // restarts of each kind
  uint64_t model_mib = 1024;     // f32 weights of the generated model
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunRestart(const RestartOptions& options);

}  // namespace warmpool::bench
