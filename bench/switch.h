// warmpool-bench --switch: a switch between two models forced by a full budget. A private warmpoold
// has a budget of exactly one model plus its workspace; two dense models of --model-mib MiB (the
// same shape, different weights) are requested in turn, so that every request evicts the other
// model and loads its own from the page cache. Each such request is timed from send to reply and
// compared, in the same run, with a read of the model's file from the page cache (`cat`). The
// ratio cat / switch says how much of the machine's copy speed a switch keeps: the memory the
// eviction frees is the memory the load needs, and reusing its pages (already faulted in) is what
// keeps a switch near `cat`. It prints the figures and asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct SwitchOptions {
  std::string daemon;            // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t iterations = 10;      // timed switches (each model in turn)
  uint64_t model_mib = 512;      // f32 weights of each generated model
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunSwitch(const SwitchOptions& options);

}  // namespace warmpool::bench
