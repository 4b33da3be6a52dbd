// warmpool-bench --generate --embeddings: what grouping short inputs buys an embedding request,
// in-process on the streams bench's model (bench/language_model.h: 256 MiB of bf16 weights by
// default). The baseline, in the same rounds: the same inputs embedded one at a time, as the engine
// did before groups (EmbedTokens, one step of the model per input). Then the same inputs in groups
// (EmbedGroupEnd, EmbedGroup: one step per group, every projection reading each weight once for
// all of its inputs). --batch inputs of --tokens tokens each (64 of 16 by default). Reports the
// medians of both, inputs per second, and their ratio; asserts nothing.
#pragma once

#include <cstdint>

namespace warmpool::bench {

struct EmbedCostOptions {
  uint32_t model_mib = 256;
  uint32_t inputs = 64;
  uint32_t tokens = 16;
  uint32_t threads = 2;
  uint32_t rounds = 5;
  bool json = false;
};

int RunEmbedCost(const EmbedCostOptions& options);

}  // namespace warmpool::bench
