#include "engines/transformer/gpu_slots.h"

#include <algorithm>
#include <limits>

#include "engines/transformer/generation.h"

namespace warmpool::transformer {

// A step carries at most kGpuChunkRows of prompts beside one row a decoding sequence
// (sequence_slots.h's budgets), which the plan's rows hold.
static_assert(kPrefillPiece <= kGpuChunkRows && kStepPromptTokens <= kGpuChunkRows);

Status StepOnGpu(GpuModel& model, std::span<const GpuCacheRun> runs, std::span<float> out, std::span<int32_t> argmax) {
  const uint32_t vocab = model.config().vocab_size;
  // What the model refuses is refused before any cache prepares (which forgets what a position held).
  uint64_t rows = 0;
  for (const GpuCacheRun& run : runs) rows += run.tokens.size();
  if (runs.empty() || runs.size() > model.plan().sequences || rows > model.plan().rows) {
    return Error(Code::kInvalidArgument, "a step of {} runs and {} rows (at most {} and {})", runs.size(), rows,
                 model.plan().sequences, model.plan().rows);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].cache == nullptr || runs[i].tokens.empty()) {
      return Error(Code::kInvalidArgument, "run {} of the step has no {}", i, runs[i].cache ? "tokens" : "cache");
    }
    for (size_t j = 0; j < i; ++j) {
      if (runs[j].cache == runs[i].cache) return Error(Code::kInvalidArgument, "a cache is in the step twice");
    }
    for (int32_t token : runs[i].tokens) {
      if (token < 0 || static_cast<uint32_t>(token) >= vocab) {
        return Error(Code::kInvalidArgument, "token {} is outside the vocabulary of {}", token, vocab);
      }
    }
  }
  for (const GpuCacheRun& run : runs) {
    const auto end = static_cast<uint64_t>(run.start) + run.tokens.size();
    if (end > run.cache->context() || run.start > run.cache->length()) {
      return Error(Code::kInvalidArgument, "positions {} to {} do not follow a KV cache of {} in a context of {}",
                   run.start, end - 1, run.cache->length(), run.cache->context());
    }
  }
  for (const GpuCacheRun& run : runs) {
    // Blocks taken, and a shared one copied on the device (queued before the step) before it is
    // written. A pool with no block left fails here, as on the CPU (KvCache::Prepare).
    const auto end = static_cast<uint32_t>(run.start + run.tokens.size());
    if (Status s = run.cache->Prepare(run.start, end); !s.ok()) return s;
  }
  std::vector<int32_t> tokens;
  std::vector<GpuRun> step;
  for (const GpuCacheRun& run : runs) {
    tokens.insert(tokens.end(), run.tokens.begin(), run.tokens.end());
    step.push_back({run.cache->blocks(), run.start, static_cast<uint32_t>(run.tokens.size()), run.want});
  }
  // The records of the blocks about to be written claim nothing there before the step writes.
  KvRegion& records = runs.front().cache->pool().region();
  if (Status s = MirrorRecords(model, records); !s.ok()) return s;
  if (Status s = model.Step(tokens, step, out, argmax); !s.ok()) return s;
  // Every layer of every run holds its keys and values: the positions count, and full blocks join
  // the prefix cache.
  for (const GpuCacheRun& run : runs) run.cache->Commit(run.start, run.tokens);
  // Raised there after the step wrote. Not in time, they claim less than is in place, never more:
  // written with the next step's (the records stay marked), the step's results stand.
  (void)MirrorRecords(model, records);
  return OkStatus();
}

Status MirrorRecords(GpuModel& model, KvRegion& records) {
  const std::vector<KvRegion::ImageWrite> writes = records.ImageWrites();
  if (writes.empty()) return OkStatus();
  if (Status s = model.WriteToPool(writes); !s.ok()) return s;
  records.ImageWritten();
  return OkStatus();
}

Result<std::unique_ptr<KvPool>> MakeGpuPool(GpuModel& model) {
  Result<std::unique_ptr<KvPool>> pool =
      KvPool::MakeElsewhere(model.config(), model.plan().blocks, [&model](KvRegion& records, uint32_t from, uint32_t to) {
        if (Status s = MirrorRecords(model, records); !s.ok()) return s;
        return model.CopyBlock(from, to);
      });
  // The header there from the start: a reader finds a pool of this shape, claiming nothing yet.
  if (pool.ok()) {
    if (Status s = MirrorRecords(model, (*pool)->region()); !s.ok()) return s;
  }
  return pool;
}

Result<std::unique_ptr<KvPool>> AdoptGpuPool(GpuModel& model, const KvRegion& host) {
  if (host.data() == nullptr || host.blocks() != model.plan().blocks) {
    return Error(Code::kInvalidArgument, "a KV region of {} blocks is not this GPU pool's {}", host.blocks(),
                 model.plan().blocks);
  }
  Result<std::unique_ptr<KvPool>> pool = MakeGpuPool(model);  // its records claim nothing there yet
  if (!pool.ok()) return pool.status();
  const KvRegion::ImageWrite floats{0, host.data(),
                                    uint64_t{host.blocks()} * host.BlockElements() * host.element_bytes()};
  if (Status s = model.WriteToPool({&floats, 1}); !s.ok()) return s;
  (*pool)->AdoptRecords(host);
  if (Status s = MirrorRecords(model, (*pool)->region()); !s.ok()) {
    // Some of them may be there already, naming generations the engine's own pool (kept on this
    // failure, its blocks' generations beginning again) may reach with other contents: they are
    // told to claim nothing. Best effort — the device refused a write already.
    (*pool)->region().ClaimNothing();
    (void)MirrorRecords(model, (*pool)->region());
    return s;
  }
  return pool;
}

Result<std::unique_ptr<KvPool>> EmptyGpuPool(GpuModel& model) {
  Result<std::unique_ptr<KvPool>> pool = MakeGpuPool(model);
  if (!pool.ok()) return pool.status();
  (*pool)->region().ClaimNothing();
  if (Status s = MirrorRecords(model, (*pool)->region()); !s.ok()) return s;
  return pool;
}

uint32_t ImportOnGpu(GpuModel& model, KvCache& cache, const wp_region& source, const KvRegion& source_records,
                     std::span<const int32_t> tokens, uint32_t most) {
  return cache.Import(source_records, tokens, most, [&](std::span<const KvCache::Rows> rows) {
    // The blocks taken for the copy claim nothing there before it lands.
    if (Status s = MirrorRecords(model, cache.pool().region()); !s.ok()) return s;
    return model.CopyFromPool(source, rows);
  });
}

Status GpuSlots::Step(std::span<const Run> runs, std::span<float> logits, std::span<int32_t> argmax) {
  if (Status s = CheckRuns(runs, logits, argmax); !s.ok()) return s;
  std::vector<GpuCacheRun> step;
  for (const Run& run : runs) {
    step.push_back({&Cache(run.slot), run.tokens, run.start,
                    run.argmax_only ? GpuRun::Want::kArgMax : GpuRun::Want::kLogits});
  }
  std::fill(argmax.begin(), argmax.begin() + static_cast<ptrdiff_t>(runs.size()), -1);
  const uint32_t vocab = model_.config().vocab_size;
  if (Status s = StepOnGpu(model_, step, logits.first(runs.size() * uint64_t{vocab}), argmax); !s.ok()) return s;
  // A run that wanted its argmax alone and found no logit that is a number: its logits (not copied
  // back) say so too, so that its sequence fails as one does on the CPU, not on a row of zeros.
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].argmax_only && argmax[i] < 0) {
      std::fill_n(logits.begin() + static_cast<ptrdiff_t>(i * vocab), vocab, std::numeric_limits<float>::quiet_NaN());
    }
  }
  return OkStatus();
}

Status GpuSequence::Run(std::span<const int32_t> tokens, uint32_t start, GpuRun::Want want, std::span<float> out,
                        int32_t* argmax) {
  if (tokens.empty()) return Error(Code::kInvalidArgument, "no tokens to run");
  if (uint64_t{start} + tokens.size() > cache_.context()) {
    return Error(Code::kInvalidArgument, "positions {} to {} are past the context of {} tokens", start,
                 uint64_t{start} + tokens.size() - 1, cache_.context());
  }
  const uint32_t piece = model_.plan().rows - model_.plan().sequences;  // a step's prompt rows
  for (size_t done = 0; done < tokens.size(); done += piece) {
    const size_t count = std::min<size_t>(piece, tokens.size() - done);
    const bool last = done + count == tokens.size();
    const GpuCacheRun run{&cache_, tokens.subspan(done, count), static_cast<uint32_t>(start + done),
                          last ? want : GpuRun::Want::kNothing};
    int32_t chosen = -1;
    if (Status s = StepOnGpu(model_, {&run, 1}, last ? out : std::span<float>(), {&chosen, 1}); !s.ok()) return s;
    if (last && argmax != nullptr) *argmax = chosen;
  }
  return OkStatus();
}

Status GpuSequence::Forward(std::span<const int32_t> tokens, uint32_t start, std::span<float> logits) {
  if (logits.size() < model_.config().vocab_size) {
    return Error(Code::kInvalidArgument, "{} floats for the logits where {} are needed", logits.size(),
                 model_.config().vocab_size);
  }
  return Run(tokens, start, GpuRun::Want::kLogits, logits.first(model_.config().vocab_size), nullptr);
}

Status GpuSequence::Hidden(std::span<const int32_t> tokens, uint32_t start, std::span<float> hidden) {
  if (hidden.size() < model_.config().hidden_size) {
    return Error(Code::kInvalidArgument, "{} floats for the hidden state where {} are needed", hidden.size(),
                 model_.config().hidden_size);
  }
  return Run(tokens, start, GpuRun::Want::kHidden, hidden.first(model_.config().hidden_size), nullptr);
}

Result<int32_t> GpuSequence::ForwardArgMax(std::span<const int32_t> tokens, uint32_t start) {
  int32_t chosen = -1;
  if (Status s = Run(tokens, start, GpuRun::Want::kArgMax, {}, &chosen); !s.ok()) return s;
  if (chosen < 0) return Error(Code::kInternal, "the model gave no logit that is a number: nothing can be sampled");
  return chosen;
}

namespace {

// Owns what GpuSequence borrows; members go in reverse order (the pool copies through the model).
class OwnGpuSequence final : public Sequence {
 public:
  std::unique_ptr<GpuModel> model;
  std::unique_ptr<KvPool> pool;
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<GpuSequence> sequence;
  const Config& config() const override { return sequence->config(); }
  uint32_t context() const override { return sequence->context(); }
  Status Forward(std::span<const int32_t> tokens, uint32_t start, std::span<float> logits) override {
    return sequence->Forward(tokens, start, logits);
  }
  Status Hidden(std::span<const int32_t> tokens, uint32_t start, std::span<float> hidden) override {
    return sequence->Hidden(tokens, start, hidden);
  }
  Result<int32_t> ForwardArgMax(std::span<const int32_t> tokens, uint32_t start) override {
    return sequence->ForwardArgMax(tokens, start);
  }
  std::string Describe() const override { return sequence->Describe(); }
};

}  // namespace

std::unique_ptr<Sequence> StartGpuSequence(const Config& config, const ModelWeights& weights,
                                           const wp_device_memory* memory, uint32_t context, std::string* why) {
  auto own = std::make_unique<OwnGpuSequence>();
  own->model = StartGpuModel(config, weights, memory, context, 1, KvPoolBlocks(context, 1), why);
  if (!own->model) return nullptr;
  Result<std::unique_ptr<KvPool>> pool = MakeGpuPool(*own->model);
  if (!pool.ok()) {
    *why = pool.status().message();
    return nullptr;
  }
  own->pool = std::move(*pool);
  own->cache = std::make_unique<KvCache>(*own->pool, context);
  own->sequence = std::make_unique<GpuSequence>(*own->model, *own->cache);
  return own;
}

}  // namespace warmpool::transformer
