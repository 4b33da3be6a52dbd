// warmpool-bench --generate --second-turn: the prefix cache through the daemon. On one private
// warmpoold serving bench/language_model.h's model, each round sends a chat's first turn (a
// --long-prompt history of about 2048 tokens, its start unique to the round so that no earlier
// round's blocks match) and then its second (that history, the first turn's answer and a new
// question), and times each from send to its first token. Reports the medians, the second turn's
// against the first (goal, issue 28: <= 0.2x after a 2k-token history) and the prompt tokens the
// daemon says came from the cache. With --replicas 2 or more, another connection's stream (a
// prompt of its own) starts after the first turn and runs while the second is sent: it goes where
// the first went (both replicas idle, the first in order), so that the least busy replica is the
// other one, whose cache holds nothing of the history; the second turn finds its history only if
// the daemon sends it to the first turn's replica anyway (supervisor/core/prefix_homes.h).
// Asserts nothing.
#pragma once

#include <cstdint>
#include <string>

namespace warmpool::bench {

struct SecondTurnOptions {
  std::string daemon;  // warmpoold binary; empty: next to warmpool-bench
  std::string backend = "host";  // warmpoold --backend
  uint32_t model_mib = 256;
  uint32_t history = 2048;  // tokens of the first turn's prompt, roughly
  uint32_t tokens = 16;     // the first turn's answer
  uint32_t rounds = 3;
  uint32_t replicas = 1;
  std::string tokenizer_dir = "demo/license-llama";
  bool json = false;
};

int RunSecondTurn(const SecondTurnOptions& options);

}  // namespace warmpool::bench
