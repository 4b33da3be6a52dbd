// warmpool-bench --generate --http: the same greedy generation through the OpenAI-compatible
// endpoint (POST /v1/completions, server-sent events over loopback TCP) and through the framed
// protocol (a streamed Generate on the Unix socket), alternated round by round on one private
// warmpoold, so that both see the same machine: tokens per second of the whole stream (sent to its
// last token) and the time to the first token, medians of --rounds. The goals the figures are read
// against (issue 27): SSE tokens/s >= 0.95x the framed, and a first token at most 1 ms later.
// The model is bench/language_model.h's; asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct HttpGenerateOptions {
  std::string daemon;  // warmpoold binary; empty: next to warmpool-bench
  uint32_t model_mib = 64;
  uint32_t prompt = 32;
  uint32_t tokens = 64;
  uint32_t rounds = 7;
  std::string tokenizer_dir = "demo/license-llama";
  bool json = false;
};

int RunHttpGenerate(const HttpGenerateOptions& options);

}  // namespace warmpool::bench
