// warmpool-bench --generate --attention: decode attention alone (DecodeAttention), in-process, for
// --batch sequences over the layers of bench/language_model.h's 256 MiB model (11 layers, 16 query
// heads and 4 KV heads of 64), each sequence's one new row attending to --prompt positions of its
// own KV cache, once per layer: the attention of one decode step of that many streams. The
// baseline, in the same rounds: reading the same keys and values once, in order (a sum of every
// float of them). Twice, with the caches in memory (each step's keys and values read after all
// the others', as a step that streams the weights in between finds them) and with one sequence's
// first layer in the cache, called as often. Reports the medians and the first's ratio to reading.
// Asserts nothing.
#pragma once

#include <cstdint>

namespace warmpool::bench {

struct DecodeAttentionOptions {
  uint32_t sequences = 8;
  uint32_t positions = 256;
  uint32_t threads = 1;
  uint32_t rounds = 5;
  bool json = false;
};

int RunDecodeAttention(const DecodeAttentionOptions& options);

}  // namespace warmpool::bench
