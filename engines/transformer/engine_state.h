// The transformer engine's state behind the C ABI (engine.cc), and how it comes to serve
// (engine_load.cc): opened from a model directory's descriptor or from the description a load
// wrote, loaded from the directory into one region (or attached to one), bound to compute on the
// CPU or the GPU.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/model_directory.h"
#include "engines/transformer/packed_model.h"
#include "engines/transformer/sequence.h"
#include "engines/transformer/sequence_slots.h"
#include "warmpool/engine.h"

namespace warmpool::transformer {

struct TransformerEngine {
  const wp_device_memory* memory = nullptr;
  bool on_device = false;  // the region is device memory (read and write through the service)
  std::string name;
  int directory = -1;  // a load's, until it ends
  uint32_t context = 0;
  PackedModel packed;
  std::string header;  // packed, encoded: describe()
  wp_region region{nullptr, 0, -1};
  bool has_region = false;
  bool has_head = true;  // false: no output head (weights.h), so it embeds only
  // Bound once the region holds the model (load, attach).
  std::optional<ServingFiles> files;
  std::unique_ptr<uint8_t[]> host_copy;  // on device memory, when the GPU cannot compute
  std::unique_ptr<CpuModel> model;       // on the CPU
  std::unique_ptr<GpuModel> gpu_model;   // on a GPU (its pool's blocks are device memory)
  std::unique_ptr<KvPool> kv_pool;       // every sequence's cache is blocks of it
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Sequence> sequence;    // embeddings and typed runs: the CPU's, or the GPU's
  // Generations (engine ABI version 7): `sequences` open at once, each in a slot of its own (slot
  // 0's cache is `cache`, which embeddings and typed runs use while no generation is open).
  uint32_t sequences = 1;
  // Positions the KV pool holds in all, as asked (spec.kv_tokens; 0: every sequence's whole
  // context). Fewer than that, the pool is shared by what the open sequences may come to need:
  // kv_reserved blocks of it are spoken for (OpenSequence).
  uint64_t kv_tokens = 0;
  uint32_t kv_reserved = 0;
  uint32_t kv_refused = 0;  // blocks the last OpenSequence refused for want of them (0: it did not)
  // A pool smaller than every sequence's whole context admits a generation by its prompt (and its
  // first token) rather than by all it may come to need; a sequence's reservation grows with its
  // positions, a step at a time, and when the pool cannot cover the step those that arrived last are
  // preempted (engine ABI version 13): ended, their blocks freed, handed back to be resumed later.
  bool preempts = false;
  uint64_t opened = 0;  // generations opened so far: a sequence's age
  std::unique_ptr<SequenceSlots> slots;
  StepPacer pacer{kStepPromptTokens, kPrefillPiece};  // how much prompt a step carries beside decodes
  std::vector<bool> slot_used;
  uint32_t open_sequences = 0;
  // run (ABI version 5): "input_ids" i64 [tokens] to "logits" f32 [vocab_size], the next token's.
  wp_tensor signature[2]{};

  ~TransformerEngine() {
    slots.reset();
    sequence.reset();  // before the weights it reads go
    cache.reset();     // then the pool's bookkeeping, which copies through the GPU model
    kv_pool.reset();
    gpu_model.reset();
    if (directory >= 0) close(directory);
    if (has_region) memory->free(memory->ctx, &region);
  }
};

// The refusal of what needs logits from a model without an output head (has_head).
inline Status NoHead(const TransformerEngine& e) {
  return Error(Code::kFailedPrecondition,
               "model \"{}\" has no output head (its checkpoint holds no lm_head.weight): it embeds only", e.name);
}

// The spec's model described (a directory's files, or a load's description), info filled in:
// weights, workspace (host, or device memory on a GPU), context, KV bytes per token.
Status OpenEngine(const wp_engine_spec& spec, TransformerEngine& e, wp_engine_info& info);
// The directory's tensors and tokenizer into a region of the engine's memory, then BindEngine.
Status LoadEngine(TransformerEngine& e, wp_progress_fn progress, void* progress_ctx);
// The region holds the model: the tensors bound where they lie, the tokenizer parsed from its copy,
// the forward pass started on the GPU (device memory) or the CPU.
Status BindEngine(TransformerEngine& e);
// An earlier instance's KV cache region (engine ABI version 11's adopt_cache) as this one's pool,
// its prefixes kept — on a GPU, a host copy of that instance's pool region, written back into this
// one's (AdoptGpuPool): FAILED_PRECONDITION while a sequence is open or where the engine keeps no
// pool, INVALID_ARGUMENT when the region is not a pool of this model's (KvPool::Adopt).
Status AdoptCache(TransformerEngine& e, int handle, uint64_t bytes);

// A dead worker's KV cache (wp_generate_request.kv_source) opened to be read: mapped where this
// engine's pool is host memory; on a GPU, its device region imported through the memory service
// and its records read back from there. Null when it is no pool of this model's shape (nothing is
// read from it then: everything is computed, as ever).
class OpenedKvSource {
 public:
  // `device`: imported from `memory` (ptr null: none), freed with this.
  OpenedKvSource(const wp_device_memory* memory, wp_region device) : memory_(memory), device_(device) {
    source_.device = device_.ptr != nullptr ? &device_ : nullptr;
  }
  void SetRecords(KvRegion records) {
    records_ = std::move(records);
    source_.records = &records_;
  }
  ~OpenedKvSource() {
    if (device_.ptr != nullptr) memory_->free(memory_->ctx, &device_);
  }
  OpenedKvSource(const OpenedKvSource&) = delete;
  OpenedKvSource& operator=(const OpenedKvSource&) = delete;
  const KvSource& source() const { return source_; }

 private:
  const wp_device_memory* memory_;
  KvRegion records_;
  wp_region device_;
  KvSource source_;
};
std::unique_ptr<OpenedKvSource> OpenKvSource(TransformerEngine& e, int handle, uint64_t bytes);

// Generations (engine_generate.cc). A request (prompt, token ids or a chat through the model's
// template; options over the model's defaults) opened as a sequence in a free slot; steps of open
// sequences; a sequence closed, its slot free. Generate (ABI versions 3 to 6) is one sequence opened,
// stepped alone to its end, and closed.
Result<wp_sequence*> OpenSequence(TransformerEngine& e, const wp_generate_request& r, uint32_t* prompt_tokens);
Status StepSequences(TransformerEngine& e, wp_sequence_step* steps, uint32_t count, wp_step_emit_fn emit,
                     void* emit_ctx);
void CloseSequence(TransformerEngine& e, wp_sequence* sequence);
// After a step that ended it: the blocks it needs to go on when the step preempted it (version 13).
uint32_t PreemptedBlocks(const wp_sequence* sequence);
Status Generate(TransformerEngine& e, const wp_generate_request& r, wp_emit_fn emit, void* emit_ctx,
                wp_generate_result& result);

}  // namespace warmpool::transformer
