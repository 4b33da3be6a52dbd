// A sequence on a GPU: the transformer's forward pass with cuBLAS products and the kernels of
// engines/cuda (transformer_kernels.h) on the device that holds the weights, the KV cache in
// device memory granted from the device budget. The code lives in the GPU module (engines/cuda,
// warmpool-engines-cuda.so), which a worker loads only when its weights are in device memory; the
// plan of the workspace is here so that the engine counts it before anything is allocated.
//
// Numerics: f32 weights multiply f32 activations (no TF32); f16 and bf16 weights are used as
// stored and multiply activations narrowed to the same type, accumulating in f32 (cuBLAS takes A
// and B of one type). Norms, rotary embeddings, attention and the cache are f32, as on the CPU.
// Greedy decoding (no penalty, no log-probabilities) chooses on the device: the argmax kernel, one
// id copied back. Other sampling runs on the host from the logits the last token's forward pass
// copies back (vocab_size floats): the same sampler as on the CPU, so a seed means the same thing
// on either.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "engines/transformer/config.h"
#include "engines/transformer/sequence.h"
#include "engines/transformer/weights.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {

// A prompt runs through the model this many tokens at a time (each chunk attends to the cache of
// the ones before): the activations are sized by it, not by the context.
inline constexpr uint32_t kGpuChunkRows = 256;
// cuBLAS's workspace, granted from the budget with the rest (it would otherwise allocate its own).
inline constexpr uint64_t kGpuBlasWorkspaceBytes = uint64_t{8} << 20;

// Byte offsets into one device allocation, each 256-byte aligned.
struct GpuPlan {
  uint32_t chunk_rows = 0;
  uint64_t keys = 0, values = 0;          // [layer][position][kv_size] f32 each
  uint64_t x = 0, normed = 0;             // chunk x hidden
  uint64_t q = 0, attended = 0;           // chunk x q_size
  uint64_t gate = 0, up = 0;              // chunk x intermediate
  uint64_t narrow = 0;                    // chunk x the widest input, 16-bit
  uint64_t logits = 0;                    // vocab
  uint64_t inv_freq = 0;                  // head_dim / 2 doubles
  uint64_t tokens = 0;                    // chunk int32
  uint64_t chosen = 0;                    // one int32: greedy decoding's token
  uint64_t blas = 0;
  uint64_t total = 0;
};

inline GpuPlan PlanGpuSequence(const Config& c, uint32_t context) {
  GpuPlan plan;
  plan.chunk_rows = std::min(context, kGpuChunkRows);
  const uint64_t rows = plan.chunk_rows;
  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t offset = at;
    at = (at + bytes + 255) / 256 * 256;
    return offset;
  };
  const uint64_t cache = uint64_t{c.num_hidden_layers} * context * c.kv_size() * sizeof(float);
  plan.keys = take(cache);
  plan.values = take(cache);
  plan.x = take(rows * c.hidden_size * sizeof(float));
  plan.normed = take(rows * c.hidden_size * sizeof(float));
  plan.q = take(rows * c.q_size() * sizeof(float));
  plan.attended = take(rows * c.q_size() * sizeof(float));
  plan.gate = take(rows * c.intermediate_size * sizeof(float));
  plan.up = take(rows * c.intermediate_size * sizeof(float));
  const uint64_t widest = std::max({c.hidden_size, c.q_size(), c.intermediate_size});
  plan.narrow = take(rows * widest * 2);
  plan.logits = take(uint64_t{c.vocab_size} * sizeof(float));
  plan.inv_freq = take(uint64_t{c.head_dim / 2} * sizeof(double));
  plan.tokens = take(rows * sizeof(int32_t));
  plan.chosen = take(sizeof(int32_t));
  plan.blas = take(kGpuBlasWorkspaceBytes);
  plan.total = at;
  return plan;
}

// Starts the model on the device that holds `weights` (its tensors' data are device pointers in a
// region of `memory`, which must not be host-addressable), its workspace and cache allocated from
// `memory` (PlanGpuSequence(config, context).total bytes). Null, with the reason in `why`, when it
// cannot: no GPU module in this build, the CUDA runtime or cuBLAS does not start, a head too wide,
// the workspace over the budget.
std::unique_ptr<Sequence> StartGpuSequence(const Config& config, const ModelWeights& weights,
                                           const wp_device_memory* memory, uint32_t context, std::string* why);

// The module's entry point (extern "C", looked up by name): StartGpuSequence once it is loaded.
// Both sides are built together from these headers.
using GpuSequenceStart = Sequence* (*)(const Config* config, const ModelWeights* weights,
                                       const wp_device_memory* memory, uint32_t context, std::string* why);
inline constexpr char kGpuSequenceStartSymbol[] = "warmpool_transformer_cuda_start";

}  // namespace warmpool::transformer
