// warmpool-bench --generate --parked: the time to the first token of a parked language model,
// through a private warmpoold, against what it is made of, measured in the same run: the unpark
// alone (a load of the parked model, timed from send to reply) plus the prefill alone (a one-token
// generation on the ready model, from send to its first chunk). The model is a random Llama-shaped
// checkpoint of about --model-mib MiB (bf16) with the tokenizer of the shipped demo model. The goal
// the figures are read against: first token <= (unpark + prefill) x 1.1. Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct ParkedGenerateOptions {
  std::string daemon;   // warmpoold binary; empty: next to warmpool-bench
  uint32_t model_mib = 256;
  uint32_t prompt = 128;  // tokens of the prompt, roughly (text of the demo's vocabulary)
  uint32_t rounds = 5;
  std::string tokenizer_dir = "demo/license-llama";  // tokenizer.json and tokenizer_config.json
  bool json = false;
};

int RunParkedGenerate(const ParkedGenerateOptions& options);

}  // namespace warmpool::bench
