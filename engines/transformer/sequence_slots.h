// Where a model's open sequences run: the model and a KV cache per slot, on the CPU (CpuSlots:
// several sequences' tokens in one pass, CpuModel::Step, their caches blocks of one pool, which
// keeps published prompt prefixes for later sequences), on a GPU the same way (GpuSlots,
// engines/transformer/gpu_slots.h), or wherever one Sequence runs (OneSlot: one sequence at a
// time). RunStep plans and runs one step of several sequences, each in
// its slot: a decoding sequence feeds its last token, and a prompt goes in pieces. While other
// sequences decode, a step carries at most kStepPromptTokens of prompts (chunked prefill), so a long
// prompt that arrives does not stall the streams already running for its whole length — fewer
// where the engine's StepPacer (step_pacer.h) measures that they would stretch a step past
// kStepLatencyRatio times a decode step; with nobody decoding, a prompt goes kPrefillPiece at a
// time. Prompts take that budget in the order given (the
// oldest first: the first to finish its prompt is the one that waited longest).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/status.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/sequence.h"
#include "engines/transformer/step_pacer.h"
#include "engines/transformer/token_sequence.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {

inline constexpr uint32_t kStepPromptTokens = 32;

// A dead worker's KV cache that a resumed sequence takes positions from (wp_generate_request.
// kv_source): its records, and where its keys and values are not in them (a GPU's pool region,
// whose records were read back: KvRegion::FromImage), that region, imported.
struct KvSource {
  const KvRegion* records = nullptr;
  const wp_region* device = nullptr;
};

class SequenceSlots {
 public:
  virtual ~SequenceSlots() = default;
  virtual uint32_t count() const = 0;
  virtual uint32_t context() const = 0;
  virtual const Config& config() const = 0;

  // One run of a step: tokens at positions start, ... of the sequence in `slot`.
  struct Run {
    uint32_t slot = 0;
    std::span<const int32_t> tokens;
    uint32_t start = 0;
    bool argmax_only = false;  // only its last token's argmax is wanted
    bool decode = false;       // a sequence's next token, not a prompt's piece
  };
  // logits: runs.size() x vocab_size floats, each run's last token's; argmax: one per run, -1 when
  // it comes. Slots that find an argmax_only run's argmax where the logits are (a GPU) set it and
  // leave its logits alone; else the sequence finds it in the logits (a broken model's logits then
  // fail that sequence, not the step).
  // Slots must differ; INVALID_ARGUMENT for a run outside its cache or a token outside the vocabulary.
  virtual Status Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) = 0;

  // A sequence with this prompt starts in `slot`: its cache emptied, then holding what the slots
  // keep of the prompt's prefix (the prefix cache), then what `source` (a dead worker's pool of this
  // model, unless null) holds of the rest. Returns how many of the prompt's first tokens it holds
  // (fewer than all: the last one runs, for its logits). Slots that keep nothing return 0.
  virtual uint32_t Reuse(uint32_t slot, std::span<const int32_t> prompt, const KvSource* source) { return 0; }
  // The sequence in `slot` ended: what its cache holds is released (its published prefix kept).
  virtual void Free(uint32_t slot) {}
};

// Caches of one pool, one per slot (what the CPU's and the GPU's slots share): `count` caches of
// `context` positions each, blocks of `pool` (KvPoolBlocks(context, count) of them, so that every
// slot finds its blocks, or fewer with a kv_tokens budget), slot 0's the one given (the engine's
// own, which embeddings and typed runs use).
class PagedSlots : public SequenceSlots {
 public:
  PagedSlots(KvPool& pool, KvCache& first, uint32_t count);
  uint32_t count() const override { return count_; }
  uint32_t context() const override { return first_.context(); }
  uint32_t Reuse(uint32_t slot, std::span<const int32_t> prompt, const KvSource* source) override;
  void Free(uint32_t slot) override;

 protected:
  KvCache& Cache(uint32_t slot) { return slot == 0 ? first_ : *others_[slot - 1]; }
  // Reuse's second half: the positions `source` holds copied into the cache (KvCache::Import);
  // returns its length.
  virtual uint32_t Import(KvCache& cache, const KvSource& source, std::span<const int32_t> prompt, uint32_t most) {
    return source.records != nullptr && source.device == nullptr ? cache.Import(*source.records, prompt, most)
                                                                 : cache.length();
  }
  // INVALID_ARGUMENT unless logits and argmax have room for every run and each run's slot is one.
  Status CheckRuns(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax);

 private:
  KvCache& first_;
  uint32_t count_;
  std::vector<std::unique_ptr<KvCache>> others_;  // slot i > 0 at i - 1 (a cache holds no block until used)
};

// On the CPU: CpuModel::Step, every run's tokens in one pass.
class CpuSlots final : public PagedSlots {
 public:
  CpuSlots(CpuModel& model, KvPool& pool, KvCache& first, uint32_t count)
      : PagedSlots(pool, first, count), model_(model) {}
  const Config& config() const override { return model_.config(); }
  Status Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) override;

 private:
  CpuModel& model_;
};

// One sequence: its forward pass, a run at a time (a generation driven alone: generation.h).
class OneSlot final : public SequenceSlots {
 public:
  explicit OneSlot(Sequence& sequence) : sequence_(sequence) {}
  uint32_t count() const override { return 1; }
  uint32_t context() const override { return sequence_.context(); }
  const Config& config() const override { return sequence_.config(); }
  Status Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) override;

 private:
  Sequence& sequence_;
};

// A sequence in a step, in its slot.
struct StepMember {
  const TokenSequence* sequence = nullptr;
  uint32_t slot = 0;
};
// Called for each member that ran in the step (a prompt left without budget sits this one out):
// `fed` tokens went in; logits (vocab_size floats) or argmax are its last token's when its Feed
// chose. The member's sequence is advanced by the caller (TokenSequence/TextSequence::Advance).
using AdvanceFn = std::function<void(size_t member, uint32_t fed, std::span<const float> logits,
                                     std::optional<int32_t> argmax)>;
// Plans and runs one step of the members (none ended). An error of the pass itself fails the step
// (nothing is advanced). With a pacer, the prompt tokens beside decoding sequences are what it
// allows, and the step's time is told to it; without, kStepPromptTokens.
Status RunStep(SequenceSlots& slots, std::span<const StepMember> members, const AdvanceFn& advance,
               StepPacer* pacer = nullptr);

}  // namespace warmpool::transformer
