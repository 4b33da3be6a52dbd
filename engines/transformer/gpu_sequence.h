// The transformer's forward pass on a GPU: cuBLAS products and the kernels of engines/cuda
// (transformer_kernels.h) on the device that holds the weights, the KV cache in device memory
// granted from the device budget. The code lives in the GPU module (engines/cuda,
// warmpool-engines-cuda.so), which a worker loads only when its weights are in device memory; the
// plan of the workspace is here so that the engine counts it before anything is allocated.
//
// The KV cache is paged as on the CPU (engines/transformer/kv_cache.h): blocks of kKvBlockTokens
// positions in one pool, in the layout KvRegion::RowsAt gives, which the sequences' block tables
// index. The bookkeeping — which block holds what, the prefix cache — stays on the host, in a KvPool
// whose floats are on the device (KvPool::MakeElsewhere; engines/transformer/gpu_slots.h drives
// it). A step is the runs of several sequences: every product reads each weight once for all of
// their rows, and each row finds its own position, its block to write and the blocks to attend to
// through its sequence's table.
//
// Numerics: f32 weights multiply f32 activations (no TF32); f16 and bf16 weights are used as
// stored and multiply activations narrowed to the same type, accumulating in f32 (cuBLAS takes A
// and B of one type). Norms, rotary embeddings, attention and the cache are f32 (the CPU keeps a
// bf16 model's cache in bf16: ChooseKvElement; a GPU never does).
// Greedy decoding (no penalty, no log-probabilities) chooses on the device: the argmax kernel, one
// id per sequence copied back. Other sampling runs on the host from the logits copied back
// (vocab_size floats a sequence): the same sampler as on the CPU, so a seed means the same thing
// on either.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engines/transformer/config.h"
#include "engines/transformer/kv_blocks.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/kv_region.h"
#include "engines/transformer/weights.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {

// A step's prompt rows at most (a sequence's Forward goes in pieces this long); a step takes as
// many more, one per sequence, for the sequences decoding beside a prompt. The activations are
// sized by this, not by the context.
inline constexpr uint32_t kGpuChunkRows = 256;
// cuBLAS's workspace, granted from the budget with the rest (it would otherwise allocate its own).
inline constexpr uint64_t kGpuBlasWorkspaceBytes = uint64_t{8} << 20;

// Two device allocations: the KV pool's region (its blocks' keys and values first, laid out as
// KvRegion lays out a whole region, its header and records mirrored after them), which the engine
// exports for the supervisor to hold past this process; and the workspace, whose byte offsets
// (each 256-byte aligned) follow.
struct GpuPlan {
  uint32_t rows = 0;                      // a step's rows at most
  uint32_t sequences = 0;                 // runs in a step at most
  uint32_t blocks = 0;                    // the KV pool's
  uint32_t table_blocks = 0;              // a sequence's table at most (its context's blocks)
  uint64_t block_floats = 0;              // one block, every layer's keys and values
  uint64_t pool_bytes = 0;                // the pool's region: blocks x block_floats f32, then records
  uint64_t x = 0, normed = 0;             // rows x hidden
  uint64_t q = 0, attended = 0;           // rows x q_size
  uint64_t k = 0, v = 0;                  // rows x kv_size: new keys and values, before the pool
  uint64_t gate = 0, up = 0;              // rows x intermediate
  uint64_t narrow = 0;                    // rows x the widest input, 16-bit
  uint64_t finals = 0;                    // sequences x hidden: each run's last row, normed
  uint64_t logits = 0;                    // sequences x vocab
  uint64_t inv_freq = 0;                  // head_dim / 2 doubles
  uint64_t ints = 0;                      // int32: tokens, positions, table_at (rows each), tables
  uint64_t chosen = 0;                    // sequences int32: greedy decoding's tokens
  uint64_t blas = 0;
  uint64_t workspace_bytes = 0;
  uint64_t total = 0;                     // both regions: what the budget grants
};

inline GpuPlan PlanGpu(const Config& c, uint32_t context, uint32_t sequences, uint32_t pool_blocks) {
  GpuPlan plan;
  plan.sequences = std::max(sequences, 1u);
  // Prompts' rows, from any of the sequences, and one decoding row each beside them.
  plan.rows = static_cast<uint32_t>(std::min<uint64_t>(kGpuChunkRows, uint64_t{context} * plan.sequences)) +
              plan.sequences;
  plan.blocks = pool_blocks;
  plan.table_blocks = static_cast<uint32_t>((uint64_t{context} + kKvBlockTokens - 1) / kKvBlockTokens);
  plan.block_floats = uint64_t{c.num_hidden_layers} * 2 * kKvBlockTokens * c.kv_size();
  const uint64_t rows = plan.rows;
  uint64_t at = 0;
  auto take = [&](uint64_t bytes) {
    const uint64_t offset = at;
    at = (at + bytes + 255) / 256 * 256;
    return offset;
  };
  plan.pool_bytes = KvRegion::WholeBytes(c.num_hidden_layers, c.kv_size(), pool_blocks, KvElement::kF32);
  plan.x = take(rows * c.hidden_size * sizeof(float));
  plan.normed = take(rows * c.hidden_size * sizeof(float));
  plan.q = take(rows * c.q_size() * sizeof(float));
  plan.attended = take(rows * c.q_size() * sizeof(float));
  plan.k = take(rows * c.kv_size() * sizeof(float));
  plan.v = take(rows * c.kv_size() * sizeof(float));
  plan.gate = take(rows * c.intermediate_size * sizeof(float));
  plan.up = take(rows * c.intermediate_size * sizeof(float));
  const uint64_t widest = std::max({c.hidden_size, c.q_size(), c.intermediate_size});
  plan.narrow = take(rows * widest * 2);
  plan.finals = take(uint64_t{plan.sequences} * c.hidden_size * sizeof(float));
  plan.logits = take(uint64_t{plan.sequences} * c.vocab_size * sizeof(float));
  plan.inv_freq = take(uint64_t{c.head_dim / 2} * sizeof(double));
  plan.ints = take((3 * rows + uint64_t{plan.sequences} * plan.table_blocks) * sizeof(int32_t));
  plan.chosen = take(uint64_t{plan.sequences} * sizeof(int32_t));
  plan.blas = take(kGpuBlasWorkspaceBytes);
  plan.workspace_bytes = at;
  plan.total = plan.pool_bytes + plan.workspace_bytes;
  return plan;
}

// One sequence's run in a step: `rows` tokens at positions start, ...; `table` the pool's blocks
// that hold its positions (block i: positions i x kKvBlockTokens on), those the run writes
// included. What the step gives back for it: its last row's logits, their argmax alone, its final
// hidden state (an embedding), or nothing (a prompt's piece before its last).
struct GpuRun {
  enum class Want { kNothing, kLogits, kArgMax, kHidden };
  std::span<const uint32_t> table;
  uint32_t start = 0;
  uint32_t rows = 0;
  Want want = Want::kLogits;
};

class GpuModel {
 public:
  virtual ~GpuModel() = default;
  virtual const Config& config() const = 0;
  virtual uint32_t context() const = 0;
  virtual const GpuPlan& plan() const = 0;
  // One step: tokens holds each run's rows in the runs' order. out: runs x vocab_size floats
  // (runs x hidden_size when a run wants kHidden), run i's at i x that width, written for the runs
  // that want them; argmax: one per run, set for the runs that want kArgMax (-1 when no logit is a
  // number above -inf). The keys and values of every row are in the pool when it returns OK.
  // INVALID_ARGUMENT, with nothing run, for more rows or runs than the plan's, a run past the
  // context or its table, a block outside the pool, a token outside the vocabulary.
  virtual Status Step(std::span<const int32_t> tokens, std::span<const GpuRun> runs, std::span<float> out,
                      std::span<int32_t> argmax) = 0;
  // Block `from`'s keys and values copied into block `to` (a shared block, before one sequence
  // writes it), queued before the next step. An error: the copy was not queued (one that fails on
  // the device fails the next step, as any fault there does).
  virtual Status CopyBlock(uint32_t from, uint32_t to) = 0;
  // The KV pool's own region (plan().pool_bytes; its handle shareable as the weights' are): what
  // the engine exports (export_cache) for the supervisor to hold when this process dies.
  virtual const wp_region& pool() const = 0;
  // Bytes written into the pool's region at their offsets (its records' mirror, KvRegion::
  // ImageWrites), one after another in this order, after whatever was queued before (a block's
  // copy, a step) and before whatever is queued after; complete when it returns OK.
  virtual Status WriteToPool(std::span<const KvRegion::ImageWrite> writes) = 0;
  // Rows of another process's pool of this shape (`source`, imported: a dead worker's) copied into
  // this pool, at float offsets into each (KvCache::Rows); complete when it returns OK.
  virtual Status CopyFromPool(const wp_region& source, std::span<const KvCache::Rows> rows) = 0;
  // Where it runs, for the log.
  virtual std::string Describe() const = 0;
};

// Starts the model on the device that holds `weights` (its tensors' data are device pointers in a
// region of `memory`, which must not be host-addressable), its KV pool and workspace allocated
// from `memory` (PlanGpu(config, context, sequences, pool_blocks): pool_bytes and workspace_bytes). Null, with the reason in
// `why`, when it cannot: no GPU module in this build, the CUDA runtime or cuBLAS does not start, a
// head too wide, the workspace over the budget.
std::unique_ptr<GpuModel> StartGpuModel(const Config& config, const ModelWeights& weights,
                                        const wp_device_memory* memory, uint32_t context, uint32_t sequences,
                                        uint32_t pool_blocks, std::string* why);

// The module's entry point (extern "C", looked up by name): StartGpuModel once it is loaded. Both
// sides are built together from these headers.
using GpuModelStart = GpuModel* (*)(const Config* config, const ModelWeights* weights, const wp_device_memory* memory,
                                    uint32_t context, uint32_t sequences, uint32_t pool_blocks, std::string* why);
inline constexpr char kGpuModelStartSymbol[] = "warmpool_transformer_cuda_model";

}  // namespace warmpool::transformer
