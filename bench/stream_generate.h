// warmpool-bench --generate --streams N: continuous batching through the daemon. On one private
// warmpoold serving bench/language_model.h's model with [[models]] parallel = N, each round runs
// one greedy stream alone and then N at once (N connections, each its own prompt), and reports the
// aggregate decode tokens per second of the N against the one, medians of --rounds (goal, issue 28:
// >= 5x with 8 streams on the CPU): the tokens that came while all N decoded, over that window
// (from the last stream's first token to the first stream's last). Beside it, the same from the
// first send to the last token, the prompts' prefill and the ramp included. Then, once: a stream runs while another request's long prompt
// (--long-prompt tokens, 2048 by default) prefills beside it, and the running stream's
// inter-token latencies during that prefill are set against its own median outside it (goal: p99
// <= 3x the median). With --kv-cache-tokens, the model's KV cache holds that many positions, shared
// by its streams ([[models]] kv_cache_tokens) instead of a whole context each; the bench says how
// many bytes admission counts for it. With --prefill-stretch, the pieces of the long prompt are paced
// to that many decode steps instead of the default 2 ([[models]] prefill_stretch). Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct StreamGenerateOptions {
  std::string daemon;  // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t streams = 8;
  uint32_t model_mib = 256;
  uint32_t prompt = 32;
  uint32_t tokens = 64;
  uint32_t long_prompt = 2048;
  uint32_t rounds = 3;
  uint64_t kv_cache_tokens = 0;  // 0: parallel x context
  double prefill_stretch = 0;    // [[models]] prefill_stretch; 0: the engine's default
  uint32_t threads = 0;          // [daemon] threads_per_worker; 0: the daemon's default
  std::string tokenizer_dir = "demo/license-llama";
  bool json = false;
};

int RunStreamGenerate(const StreamGenerateOptions& options);

}  // namespace warmpool::bench
