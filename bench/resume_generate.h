// warmpool-bench --generate --resume: a stream whose worker is killed. On one private warmpoold
// serving bench/language_model.h's model, each round streams a greedy generation undisturbed, then
// the same again with its worker SIGKILLed when half its tokens have come; the daemon resumes the
// stream on a respawned worker after the tokens sent, copying from the dead worker's KV cache (held
// by the supervisor) what it finds there of the prompt and those tokens. Reports the gap from the
// kill to the next token against the stream's median gap between tokens, how much of the prompt
// was copied rather than computed, and whether the client's stream is the undisturbed one. Issue
// 28's goal: the next token within 50 ms + one decode step, nothing of the prompt computed again.
// Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct ResumeGenerateOptions {
  std::string daemon;  // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t model_mib = 256;
  uint32_t prompt = 128;
  uint32_t tokens = 64;
  uint32_t rounds = 3;
  std::string tokenizer_dir = "demo/license-llama";
  bool json = false;
};

int RunResumeGenerate(const ResumeGenerateOptions& options);

}  // namespace warmpool::bench
