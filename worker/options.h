// How warmpoold started this worker (its command line, worker/main.cc).
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::worker {

struct WorkerOptions {
  int channel_fd = 3;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t device = 0;
  std::string instance = "default";
  uint64_t budget_bytes = 0;
  uint32_t max_frame_bytes = 64u << 20;
  std::string engine_dir;  // engine plugins: <engine_dir>/<engine>.so; empty: built-ins only
  std::string backend = "host";  // host | cuda
  std::string sharing = "vmm";   // cuda: how the device's owner shares memory (vmm | legacy)
};

}  // namespace warmpool::worker
