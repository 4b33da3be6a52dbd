// warmpool-bench --compute's second baseline: PyTorch computing the same model file in its own
// dtype (bench/torch_dense.py, installed beside the binary as warmpool-bench-torch.py), in a
// child process that the bench asks for one call at a time, so that its calls interleave with the
// engine's in the same rounds. PyTorch is optional: without it the column is left out, saying why.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "common/status.h"

namespace warmpool::bench {

class BenchRun;

class TorchBaseline {
 public:
  // Starts `python` on the script with the model (its stderr in a file of `run`'s directory);
  // fails (FAILED_PRECONDITION, with the script's own last words) where Python or PyTorch is
  // missing.
  static Result<std::unique_ptr<TorchBaseline>> Start(BenchRun& run, const std::string& python,
                                                      const std::string& model_path, uint32_t threads);
  ~TorchBaseline();  // closes its stdin, which ends it, and reaps it
  TorchBaseline(const TorchBaseline&) = delete;
  TorchBaseline& operator=(const TorchBaseline&) = delete;

  // One forward pass of `rows` rows, as PyTorch timed it.
  Result<double> CallMs(uint32_t rows);

 private:
  TorchBaseline() = default;
  Result<std::string> ReadLine();

  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  std::string errors_;  // the child's stderr, a file in the run's directory
};

}  // namespace warmpool::bench
