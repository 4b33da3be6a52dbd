// One sequence's generation, on the CPU or a GPU (engines/transformer/sequence.h): the prompt in one forward pass, then a token at a time
// until an end token, the token limit, the end of the context, or the caller's stop.
#pragma once

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/sampler.h"
#include "engines/transformer/sequence.h"

namespace warmpool::transformer {

enum class FinishReason {
  kStop,       // an end token was chosen (it is not part of the output)
  kLength,     // max_tokens were generated, or the context is full
  kCancelled,  // the caller's on_token said to stop
};
std::string_view FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled"

struct GenerationRequest {
  std::vector<int32_t> prompt;
  uint32_t max_tokens = 16;
  SamplingOptions sampling;
  std::vector<int32_t> end_tokens;  // the model's eos tokens (generation_config.json)
};

struct Generation {
  std::vector<int32_t> tokens;  // generated, end token excluded
  FinishReason finish = FinishReason::kLength;
  uint32_t prompt_tokens = 0;
};

// A prompt runs through the model this many tokens at a time: between pieces on_progress is called,
// so that a long prompt shows it moves (a worker would otherwise be taken for hung) and can be
// cancelled before its end. Each piece attends to the cache of the ones before: the same logits.
inline constexpr uint32_t kPrefillPiece = 256;

// on_token: called with each generated token as it is chosen; returning false cancels. Checked
// once per decode step, and on_progress between a prompt's pieces: a cancelled generation stops
// within one step or piece. The sequence's cache starts
// empty (whatever it held is overwritten); errors (a prompt that does not fit, bad options, a
// token outside the vocabulary) are INVALID_ARGUMENT before anything runs.
Result<Generation> Generate(Sequence& sequence, const GenerationRequest& request,
                            const std::function<bool(int32_t)>& on_token = nullptr,
                            const std::function<bool()>& on_progress = nullptr);

// The same on the CPU, with the model and a cache.
inline Result<Generation> Generate(CpuModel& model, KvCache& cache, const GenerationRequest& request,
                                   const std::function<bool(int32_t)>& on_token = nullptr) {
  CpuSequence sequence(model, cache);
  return Generate(sequence, request, on_token);
}

}  // namespace warmpool::transformer
