#include "engines/transformer/sequence_slots.h"

#include <algorithm>
#include <chrono>

namespace warmpool::transformer {

PagedSlots::PagedSlots(KvPool& pool, KvCache& first, uint32_t count) : first_(first), count_(std::max(count, 1u)) {
  for (uint32_t slot = 1; slot < count_; ++slot) others_.push_back(std::make_unique<KvCache>(pool, first.context()));
}

uint32_t PagedSlots::Reuse(uint32_t slot, std::span<const int32_t> prompt, const KvSource* source) {
  if (slot >= count_ || prompt.empty()) return 0;
  const auto most = static_cast<uint32_t>(prompt.size() - 1);
  const uint32_t reused = Cache(slot).Reuse(prompt, most);
  return source == nullptr ? reused : Import(Cache(slot), *source, prompt, most);
}

void PagedSlots::Free(uint32_t slot) {
  if (slot < count_) Cache(slot).Clear();
}

Status PagedSlots::CheckRuns(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) {
  const uint32_t vocab = config().vocab_size;
  if (logits.size() < uint64_t{runs.size()} * vocab || argmax.size() < runs.size()) {
    return Error(Code::kInvalidArgument, "a step of {} runs needs logits and argmax for each", runs.size());
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].slot >= count_) return Error(Code::kInvalidArgument, "slot {} of {}", runs[i].slot, count_);
    for (size_t j = 0; j < i; ++j) {
      if (runs[j].slot == runs[i].slot) return Error(Code::kInvalidArgument, "slot {} twice in a step", runs[i].slot);
    }
  }
  return OkStatus();
}

Status CpuSlots::Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) {
  if (Status s = CheckRuns(runs, logits, argmax); !s.ok()) return s;
  const uint32_t vocab = model_.config().vocab_size;
  if (runs.size() == 1) {  // one sequence: its forward pass as a lone one runs it (f32 at one row)
    if (Status s = model_.Forward(runs[0].tokens, runs[0].start, Cache(runs[0].slot), logits.first(vocab)); !s.ok()) {
      return s;
    }
  } else {
    std::vector<int32_t> tokens;
    std::vector<StepRun> step;
    for (const Run& run : runs) {
      tokens.insert(tokens.end(), run.tokens.begin(), run.tokens.end());
      step.push_back({&Cache(run.slot), run.start, static_cast<uint32_t>(run.tokens.size()), run.decode});
    }
    if (Status s = model_.Step(tokens, step, logits.first(uint64_t{runs.size()} * vocab)); !s.ok()) return s;
  }
  return OkStatus();  // every run's logits are here: each sequence finds its own argmax (and its own error)
}

Status OneSlot::Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) {
  const uint32_t vocab = sequence_.config().vocab_size;
  if (runs.size() != 1 || runs[0].slot != 0 || logits.size() < vocab || argmax.empty()) {
    return Error(Code::kInvalidArgument, "one sequence runs here at a time, in slot 0");
  }
  const Run& run = runs[0];
  if (run.argmax_only) {
    Result<int32_t> best = sequence_.ForwardArgMax(run.tokens, run.start);
    if (!best.ok()) return best.status();
    argmax[0] = *best;
    return OkStatus();
  }
  return sequence_.Forward(run.tokens, run.start, logits.first(vocab));
}

Status RunStep(SequenceSlots& slots, std::span<const StepMember> members, const AdvanceFn& advance,
               StepPacer* pacer) {
  bool decoding = false;
  for (const StepMember& m : members) {
    decoding = decoding || m.sequence->position() >= m.sequence->prefill_tokens();
  }
  uint32_t prompt_budget = decoding ? kStepPromptTokens : kPrefillPiece;
  if (pacer != nullptr) prompt_budget = pacer->PromptBudget(decoding);
  const uint32_t budget = prompt_budget;
  std::vector<SequenceSlots::Run> runs;
  std::vector<size_t> ran;  // the member of each run
  for (size_t i = 0; i < members.size(); ++i) {
    const TokenSequence& s = *members[i].sequence;
    const bool prompt = s.position() < s.prefill_tokens();
    if (prompt && prompt_budget == 0) continue;
    const TokenSequence::Feed feed = s.Next(prompt ? prompt_budget : 1);
    if (prompt) prompt_budget -= static_cast<uint32_t>(feed.tokens.size());
    runs.push_back({members[i].slot, feed.tokens, feed.start, feed.chooses && s.argmax_only(), !prompt});
    ran.push_back(i);
  }
  if (runs.empty()) return OkStatus();
  const uint32_t vocab = slots.config().vocab_size;
  std::vector<float> logits(runs.size() * uint64_t{vocab});
  std::vector<int32_t> argmax(runs.size(), -1);
  const auto began = std::chrono::steady_clock::now();
  if (Status s = slots.Step(runs, logits, argmax); !s.ok()) return s;
  if (pacer != nullptr) {
    pacer->Observe(budget - prompt_budget, decoding,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    std::optional<int32_t> best;
    if (runs[r].argmax_only && argmax[r] >= 0) best = argmax[r];
    advance(ran[r], static_cast<uint32_t>(runs[r].tokens.size()),
            std::span<const float>(logits).subspan(r * vocab, vocab), best);
  }
  return OkStatus();
}

}  // namespace warmpool::transformer
