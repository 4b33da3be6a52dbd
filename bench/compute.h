// warmpool-bench --compute: the dense engine's arithmetic against a plain BLAS call, in-process
// (no daemon, no request path). One MLP (--layers, default 4096,16384,4096, relu, with biases) is
// written as f32, f16 and bf16; each is run by the dense engine on the host backend, and the f32
// weights by OpenBLAS the way numpy runs `x @ W.T + b` (sgemv for one row, sgemm otherwise),
// interleaved per round, with the same thread count for both. Reports, per batch size, the median
// time per call and its spread, and the ratios engine f32 / OpenBLAS f32, engine f16 / engine f32
// and engine bf16 / OpenBLAS f32; where Python has PyTorch, also PyTorch computing the bf16 file in
// bf16 (its native path on CPUs, oneDNN), in a child process asked once per round, and engine bf16
// / PyTorch bf16. Like the other modes it asserts nothing.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace warmpool::bench {

struct ComputeOptions {
  std::vector<uint32_t> layers = {4096, 16384, 4096};  // widths: in, hidden..., out
  std::vector<uint32_t> batches = {1, 256};
  uint32_t rounds = 5;
  uint32_t threads = 1;  // the engine's, OpenBLAS's and PyTorch's
  // Python with PyTorch for the bf16 baseline (bench/torch_dense.py); empty: none.
  std::string torch_python = "/usr/bin/python3";
  bool json = false;
};

// Runs the whole mode; returns the process exit status (0, or 1 after printing an error).
int RunCompute(const ComputeOptions& options);

}  // namespace warmpool::bench
