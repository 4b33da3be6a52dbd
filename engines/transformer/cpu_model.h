// A decoder's forward pass on the CPU, in f32, on weights used as stored (f32, f16 or bf16,
// widened in the inner loops; on bf16 weights the products take the activations narrowed to bf16,
// as PyTorch's bf16 does, wherever the CPU has a bf16 product): the architecture in
// engines/transformer/config.h.
//
// A sequence's keys and values live in its KvCache (engines/transformer/kv_cache.h: blocks of a
// pool its model's sequences share). Forward runs a run of tokens at consecutive positions against it: a whole prompt at once (prefill: every projection reads each weight once
// for all the tokens) or one token (decode). Either way each token attends to the cache's earlier
// positions and to the run's tokens up to itself, so running a prompt at once or token by token
// computes the same thing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "engines/transformer/config.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/prefill_matmul.h"
#include "engines/transformer/sequence.h"
#include "engines/transformer/weights.h"

namespace warmpool::transformer {

// A run of consecutive tokens of one sequence within a step: its cache, the first token's position,
// and how many tokens. A step of several sequences (continuous batching) is several runs: every
// projection reads each weight once for all of their tokens, and each run attends to its own cache.
struct StepRun {
  KvCache* cache = nullptr;
  uint32_t start = 0;
  uint32_t rows = 0;
  bool decode = false;  // a sequence's next token, not a prompt's piece
};

class CpuModel {
 public:
  // weights: bound to this config (BindWeights), and alive as long as this model.
  CpuModel(const Config& config, const ModelWeights& weights, int threads);

  // tokens at positions start, start + 1, ...: the cache holds positions before start and gets
  // these. logits: vocab_size floats for the last token, or tokens.size() x vocab_size with
  // all_positions. A token outside the vocabulary, a run past the cache's context or one that would
  // leave a gap after the cache's positions (start > cache.length()) is INVALID_ARGUMENT, and nothing
  // is written; RESOURCE_EXHAUSTED when the cache's pool has no block left; FAILED_PRECONDITION for a
  // model without an output head (weights.h). One call at a time per model (its scratch).
  Status Forward(std::span<const int32_t> tokens, uint32_t start, KvCache& cache, std::span<float> logits,
                 bool all_positions = false);
  // The last token's hidden state after the final norm (hidden_size floats) instead of its logits.
  Status Hidden(std::span<const int32_t> tokens, uint32_t start, KvCache& cache, std::span<float> hidden);
  // One step of several sequences: tokens holds each run's tokens in the runs' order; logits gets
  // vocab_size floats per run, for its last token. What each run computes is what Forward computes
  // for it alone (up to the order of the sums). Runs must name different caches; a run outside its
  // cache's context, a token outside the vocabulary or tokens that do not add up to the runs' is
  // INVALID_ARGUMENT, and nothing is written. A decode row (a run marked `decode`) is the same bits
  // as Forward computes for it alone, whatever runs share its step, where the CPU has the weights'
  // small-batch kernel (bf16: AVX-512 BF16; f16: AVX2 or AVX-512, with F16C); on f32, only in
  // steps of up to four rows.
  Status Step(std::span<const int32_t> tokens, std::span<const StepRun> runs, std::span<float> logits);
  // The same, giving each run's last token's hidden state after the final norm (hidden_size floats
  // per run) instead of its logits: several inputs embedded in one pass over the weights. Any
  // model, with an output head or without.
  Status StepHidden(std::span<const int32_t> tokens, std::span<const StepRun> runs, std::span<float> hidden);

  const Config& config() const { return config_; }
  int threads() const { return threads_; }

 private:
  // y = x · wᵀ + bias over `rows` rows. decoding: the rows include a decode row (see Linear's body).
  Status Linear(const float* x, uint32_t rows, const Matrix& w, const Vector& bias, float* y, bool decoding);
  // A position's rotary cosines (head_dim / 2 of them) then sines, into out (head_dim floats).
  void Rotations(uint32_t position, float* out) const;
  // Rotates `count` heads by a position's Rotations.
  void Rope(float* heads, uint32_t count, const float* rotations) const;
  // The layers over the runs' tokens: x (rows x hidden) holds the residual stream after the last one.
  Status Layers(std::span<const int32_t> tokens, std::span<const StepRun> runs, std::vector<float>& x);
  Status Check(std::span<const int32_t> tokens, std::span<const StepRun> runs, uint64_t out_size,
               uint64_t needed) const;
  // Layers, then each run's last row through the final norm into out (runs x hidden_size).
  Status LastStates(std::span<const int32_t> tokens, std::span<const StepRun> runs, float* out);

  Config config_;
  ModelWeights weights_;
  int threads_;
  std::vector<double> inv_freq_;  // head_dim / 2 rotary frequencies, scaling applied
  PrefillMatmul prefill_;         // its scratch: one Forward at a time
};

// A sequence on the CPU: the model and a cache, both borrowed.
class CpuSequence final : public Sequence {
 public:
  CpuSequence(CpuModel& model, KvCache& cache) : model_(model), cache_(cache) {}
  const Config& config() const override { return model_.config(); }
  uint32_t context() const override { return cache_.context(); }
  Status Forward(std::span<const int32_t> tokens, uint32_t start, std::span<float> logits) override {
    return model_.Forward(tokens, start, cache_, logits);
  }
  Status Hidden(std::span<const int32_t> tokens, uint32_t start, std::span<float> hidden) override {
    return model_.Hidden(tokens, start, cache_, hidden);
  }
  std::string Describe() const override;

 private:
  CpuModel& model_;
  KvCache& cache_;
};

// oneDNN generates its sgemm kernels at their first call in a process, which the attention's
// products are: a worker calls this as it starts, so that the first step of a model it attaches —
// a stream resumed after another worker's death, say — does not wait for that (about 35 ms on a
// 2-core VM, warmpool-bench --generate --resume).
void WarmCpuKernels();

}  // namespace warmpool::transformer
