// The command lines warmpoold starts its children with (warmpool-worker, warmpool-owner): for each
// child one struct, the encoder the supervisor writes it with and the declarations the child parses
// it with, side by side, so that no flag can be renamed, added or given another default on one
// side only. tests/unit/wire_tables_test.cc round-trips both through the parser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/backend.h"

namespace CLI {
class App;
}

namespace warmpool::ipc {

struct WorkerArguments {
  int channel_fd = 3;
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint32_t device = 0;
  std::string instance = "default";
  uint64_t budget_bytes = 0;  // the device's budget; 0: unlimited
  uint32_t max_frame_bytes = 64u << 20;
  int parent = 0;                // pid of the supervisor, to die with it; 0: none
  std::string engine_dir;        // engine plugins: <engine_dir>/<engine>.so; empty: built-ins only
  Backend backend = Backend::kHost;  // as the supervisor resolved it: host or cuda
  std::string sharing = "vmm";   // cuda: how the device's owner shares memory (vmm | legacy)
  uint32_t threads = 1;          // compute threads of the engines
  bool tf32 = false;             // cuda: f32 dense layers on TF32 tensor cores
};

// argv for exec, program first.
std::vector<std::string> WorkerCommandLine(const std::string& program, const WorkerArguments& arguments);
// The worker's side: every option of WorkerCommandLine, bound to `arguments`, with its checks.
void DeclareWorkerArguments(CLI::App& app, WorkerArguments& arguments);

struct OwnerArguments {
  bool probe = false;  // print the machine's CUDA devices as JSON and exit (no channel)
  int channel_fd = 3;
  uint32_t device = 0;
  std::string sharing = "auto";  // auto | vmm | legacy
  int parent = 0;
};

std::vector<std::string> OwnerCommandLine(const std::string& program, const OwnerArguments& arguments);
void DeclareOwnerArguments(CLI::App& app, OwnerArguments& arguments);

}  // namespace warmpool::ipc
