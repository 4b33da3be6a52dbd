// One sequence's forward passes, wherever they run: a model and the KV cache of one sequence, on
// the CPU (CpuSequence, engines/transformer/cpu_model.h) or on a GPU (GpuSequence, engines/
// transformer/gpu_slots.h). Generation (engines/transformer/generation.h) drives either the same way, and
// samples on the host from the logits either returns.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "common/status.h"
#include "engines/transformer/config.h"

namespace warmpool::transformer {

class Sequence {
 public:
  virtual ~Sequence() = default;
  virtual const Config& config() const = 0;
  // The positions its KV cache holds.
  virtual uint32_t context() const = 0;
  // tokens at positions start, start + 1, ...: the cache holds positions before start and gets
  // these. logits: vocab_size floats (host memory) for the last token. A token outside the
  // vocabulary or a run past the context is INVALID_ARGUMENT, and nothing is written.
  virtual Status Forward(std::span<const int32_t> tokens, uint32_t start, std::span<float> logits) = 0;
  // The same, returning instead the last token's hidden state after the final norm (hidden_size
  // floats): what the output head reads, and what an embedding is made of.
  virtual Status Hidden(std::span<const int32_t> tokens, uint32_t start, std::span<float> hidden) = 0;
  // The same, returning only the most likely next token as ArgMaxToken chooses it (greedy
  // decoding): a GPU finds it on the device and copies back one id instead of the logits. This
  // default computes the logits and looks on the host.
  virtual Result<int32_t> ForwardArgMax(std::span<const int32_t> tokens, uint32_t start);
  // Where it runs, for the log ("CPU, 8 threads", "cuBLAS on CUDA device 0 (...)").
  virtual std::string Describe() const = 0;
};

}  // namespace warmpool::transformer
