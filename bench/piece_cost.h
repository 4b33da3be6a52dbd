// warmpool-bench --generate --pieces: what a prompt's piece costs a step that also decodes, by
// its size and position, in-process on the streams bench's model (bench/language_model.h: 256 MiB
// of bf16 weights by default, 1024 wide, 16 heads and 4 KV heads, the engine's choice of KV
// cache). The baseline, in the same rounds: the step alone, one stream's decode row at position
// 200. Then, for pieces of 1 to 64 tokens of a second sequence at position 0 and at --prompt
// (2000 by default), that row and the piece in one step (CpuModel::Step, as continuous batching
// runs them: every product in the small-batch kernel, the piece's attention by its size). Each
// timed step writes the same positions again. Reports the medians, each step against the decode
// step alone and the milliseconds it added per prompt token: what the engine's step pacer
// (engines/transformer/step_pacer.h) trades against the streams' gaps. Asserts nothing.
#pragma once

#include <cstdint>

namespace warmpool::bench {

struct PieceCostOptions {
  uint32_t model_mib = 256;
  uint32_t position = 2000;  // the long position; 0 is always measured too
  uint32_t threads = 2;
  uint32_t rounds = 5;
  bool json = false;
};

int RunPieceCost(const PieceCostOptions& options);

}  // namespace warmpool::bench
