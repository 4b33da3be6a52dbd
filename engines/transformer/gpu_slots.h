// A model's sequences on a GPU (engines/transformer/gpu_sequence.h): the host's half. GpuSlots
// steps several sequences in one pass of the GPU model, as CpuSlots does on the CPU: each slot's
// KvCache is a table of the pool's blocks, kept here (KvPool::MakeElsewhere) while the blocks'
// keys and values are on the device. Before a step every run's cache prepares its blocks (taking
// free ones, copying a shared one on the device before it is written), the tables go to the device
// with the step, and once the step is done the positions are committed — published to the prefix
// cache as on the CPU. GpuSequence is one cache's forward passes on the same model (embeddings,
// typed runs), a prompt longer than a step going in pieces.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/sequence.h"
#include "engines/transformer/sequence_slots.h"

namespace warmpool::transformer {

// One step on the GPU model: each run's cache prepared, the step run, the positions committed. The
// caches must differ. out and argmax as GpuModel::Step has them. What the model would refuse (too
// many runs or rows, a token outside the vocabulary, a run past its context or after a gap) is
// refused before any cache changes. A failure after that (no block left, the step itself) commits
// nothing: each cache then holds the positions before its run's start (KvCache::Prepare).
struct GpuCacheRun {
  KvCache* cache = nullptr;
  std::span<const int32_t> tokens;
  uint32_t start = 0;
  GpuRun::Want want = GpuRun::Want::kLogits;
};
Status StepOnGpu(GpuModel& model, std::span<const GpuCacheRun> runs, std::span<float> out, std::span<int32_t> argmax);

// The KV pool of `model`'s plan: its bookkeeping here, its blocks copied on the device, its records
// mirrored into the pool's region (GpuModel::pool) before any block is written there — a step, a
// block's copy, an import — and after a step raised them. So the region the supervisor holds when
// this process dies says, as a whole region does on the CPU, which tokens' keys and values are in
// place there (KvRegion::ImageWrites).
Result<std::unique_ptr<KvPool>> MakeGpuPool(GpuModel& model);
// The records changed since their last mirror written into the pool's region (WriteToPool).
Status MirrorRecords(GpuModel& model, KvRegion& records);
// A parked pool's host copy (a whole region of this pool's shape: the device region as it was
// copied out when its model parked, KvRegion::Open) taken over by a fresh pool of `model`, before
// any cache takes a block: its keys and values written into the pool's region first, then its
// records (KvPool::AdoptRecords: the prefix cache kept), mirrored there.
Result<std::unique_ptr<KvPool>> AdoptGpuPool(GpuModel& model, const KvRegion& host);
// A fresh pool of `model` whose every record says, in the pool's region too, that it holds
// nothing: what replaces the pool after an adopt that failed when some of its writes may have
// reached the region.
Result<std::unique_ptr<KvPool>> EmptyGpuPool(GpuModel& model);
// KvCache::Import on the GPU: `source` a dead worker's pool region of this shape (imported),
// `source_records` its records read back (KvRegion::FromImage). Returns the cache's length now.
uint32_t ImportOnGpu(GpuModel& model, KvCache& cache, const wp_region& source, const KvRegion& source_records,
                     std::span<const int32_t> tokens, uint32_t most);

class GpuSlots final : public PagedSlots {
 public:
  GpuSlots(GpuModel& model, KvPool& pool, KvCache& first, uint32_t count)
      : PagedSlots(pool, first, count), model_(model) {}
  const Config& config() const override { return model_.config(); }
  Status Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) override;

 protected:
  // A source whose keys and values are device memory (a GPU's pool region): copied there.
  uint32_t Import(KvCache& cache, const KvSource& source, std::span<const int32_t> prompt, uint32_t most) override {
    return source.records != nullptr && source.device != nullptr
               ? ImportOnGpu(model_, cache, *source.device, *source.records, prompt, most)
               : cache.length();
  }

 private:
  GpuModel& model_;
};

// One sequence on the GPU: the model and a cache of its pool, both borrowed.
class GpuSequence final : public Sequence {
 public:
  GpuSequence(GpuModel& model, KvCache& cache) : model_(model), cache_(cache) {}
  const Config& config() const override { return model_.config(); }
  uint32_t context() const override { return cache_.context(); }
  Status Forward(std::span<const int32_t> tokens, uint32_t start, std::span<float> logits) override;
  Status Hidden(std::span<const int32_t> tokens, uint32_t start, std::span<float> hidden) override;
  Result<int32_t> ForwardArgMax(std::span<const int32_t> tokens, uint32_t start) override;
  std::string Describe() const override { return model_.Describe(); }

 private:
  // The tokens in pieces of at most a step's prompt rows; the last one's result as `want` says.
  Status Run(std::span<const int32_t> tokens, uint32_t start, GpuRun::Want want, std::span<float> out,
             int32_t* argmax);
  GpuModel& model_;
  KvCache& cache_;
};

// A sequence with a GPU model, a pool and a cache of its own, for `context` positions: tools and
// tests. Null, with the reason in `why`, when the model does not start (StartGpuModel).
std::unique_ptr<Sequence> StartGpuSequence(const Config& config, const ModelWeights& weights,
                                           const wp_device_memory* memory, uint32_t context, std::string* why);

}  // namespace warmpool::transformer
