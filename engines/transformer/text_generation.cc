#include "engines/transformer/text_generation.h"

#include <optional>

#include "engines/transformer/sequence_slots.h"
#include "engines/transformer/text_sequence.h"

namespace warmpool::transformer {

Result<TextResult> GenerateText(Sequence& model, const ServingFiles& files, const TextRequest& request,
                                const EmitFn& emit) {
  Result<TextSequence> started = TextSequence::Start(files, request, model.context(), model.config().vocab_size);
  if (!started.ok()) return started.status();
  TextSequence& sequence = *started;
  const TokenSequence& tokens = sequence.tokens();
  OneSlot slot(model);
  const StepMember member{&tokens, 0};
  while (!sequence.ended()) {
    // Between a prompt's pieces: progress, nothing to send, and a point where it can be stopped.
    if (tokens.position() > 0 && tokens.position() < tokens.prefill_tokens() && !emit("", {}, {})) {
      sequence.Cancel();
      break;
    }
    Result<TextSequence::Output> out = Error(Code::kInternal, "the step did not run the sequence");
    Status ran = RunStep(slot, {&member, 1}, [&](size_t, uint32_t fed, std::span<const float> logits,
                                                 std::optional<int32_t> argmax) {
      out = sequence.Advance(fed, logits, argmax);
    });
    if (!ran.ok()) return ran;
    if (!out.ok()) return out.status();
    if (!out->token && out->text.empty()) continue;
    std::span<const int32_t> token;
    if (out->token) token = {&*out->token, 1};
    std::span<const TokenLogprobs> logprobs;
    if (out->logprobs) logprobs = {&*out->logprobs, 1};
    if (!emit(out->text, token, logprobs)) sequence.Cancel();
  }
  return sequence.result();
}

}  // namespace warmpool::transformer
