#include "engines/transformer/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <stdexcept>

namespace warmpool::transformer {

uint32_t KvPoolBlocks(uint32_t context, uint32_t sequences, uint64_t kv_tokens) {
  const uint64_t per_sequence = KvBlocksOf(context);
  const uint64_t whole = std::min<uint64_t>(per_sequence * std::max(sequences, 1u), UINT32_MAX - 1);
  if (kv_tokens == 0) return static_cast<uint32_t>(whole);
  return static_cast<uint32_t>(std::clamp<uint64_t>((kv_tokens + kKvBlockTokens - 1) / kKvBlockTokens,
                                                    std::min(per_sequence, whole), whole));
}

Result<std::unique_ptr<KvPool>> KvPool::Make(const Config& config, uint32_t blocks) {
  Result<KvRegion> region = KvRegion::Create(config.num_hidden_layers, config.kv_size(), blocks, config.kv_element);
  if (!region.ok()) return region.status();
  return std::unique_ptr<KvPool>(new KvPool(config, blocks, std::move(*region)));
}

Result<std::unique_ptr<KvPool>> KvPool::MakeElsewhere(const Config& config, uint32_t blocks, BlockCopy copy) {
  Result<KvRegion> region =
      KvRegion::CreateRecords(config.num_hidden_layers, config.kv_size(), blocks, config.kv_element);
  if (!region.ok()) return region.status();
  std::unique_ptr<KvPool> pool(new KvPool(config, blocks, std::move(*region)));
  pool->copy_elsewhere_ = std::move(copy);
  return pool;
}

Result<std::unique_ptr<KvPool>> KvPool::Adopt(const Config& config, uint32_t blocks, int handle, uint64_t bytes) {
  Result<KvRegion> region =
      KvRegion::Adopt(handle, bytes, config.num_hidden_layers, config.kv_size(), blocks, config.kv_element);
  if (!region.ok()) return region.status();
  std::unique_ptr<KvPool> pool(new KvPool(config, blocks, std::move(*region)));
  pool->RestorePrefixes();
  return pool;
}

void KvPool::AdoptRecords(const KvRegion& source) {
  std::vector<int32_t> tokens;
  for (const KvRegion::Standing& r : source.Records(tokens)) {
    region_.Describe({r.block, r.generation}, r.parent, r.tokens, r.flags);
  }
  RestorePrefixes();
}

void KvPool::RestorePrefixes() {
  std::vector<int32_t> tokens;
  const std::vector<KvRegion::Standing> records = region_.Records(tokens);
  std::vector<uint32_t> generations(blocks_.count(), 0);
  std::multimap<std::pair<uint32_t, uint32_t>, const KvRegion::Standing*> children;
  for (const KvRegion::Standing& r : records) {
    generations[r.block] = r.generation;
    // Only full blocks were published (KvCache::Commit); a sequence's partial last block is not
    // a prefix another request can take.
    // Nor one of keys and values copied from a dead worker, or computed after such (kKvRecordPrivate).
    if (r.count == kKvBlockTokens && (r.flags & kKvRecordPrivate) == 0) {
      children.emplace(std::pair{r.parent.block, r.parent.generation}, &r);
    }
  }
  // From the root, parents before children: each record names one parent, so no block is met twice
  // and records that loop (none a writer leaves) are never reached.
  std::vector<KvBlocks::Kept> kept;
  std::vector<KvLink> frontier{KvBlocks::kRoot};
  for (size_t next = 0; next < frontier.size(); ++next) {
    auto [first, last] = children.equal_range({frontier[next].block, frontier[next].generation});
    for (auto it = first; it != last; ++it) {
      const KvRegion::Standing& r = *it->second;
      kept.push_back({r.block, r.generation, r.parent, r.tokens});
      frontier.push_back({r.block, r.generation});
    }
  }
  blocks_.Restore(kept, generations);
  // A record the prefix cache does not keep now claims nothing: the block is free, to be taken.
  for (uint32_t b = 0; b < blocks_.count(); ++b) {
    if (!blocks_.published(b)) region_.Describe(blocks_.LinkOf(b), KvBlocks::kRoot, {});
  }
}

KvPool::KvPool(const Config& config, uint32_t blocks, KvRegion region)
    : layers_(config.num_hidden_layers), kv_size_(config.kv_size()), blocks_(blocks), region_(std::move(region)) {}

Status KvPool::Copy(uint32_t from, uint32_t to) {
  if (copy_elsewhere_) return copy_elsewhere_(region_, from, to);
  const uint64_t bytes = region_.BlockElements() * region_.element_bytes();
  auto* data = static_cast<uint8_t*>(region_.data());
  std::memcpy(data + to * bytes, data + from * bytes, bytes);
  return OkStatus();
}

namespace {

std::unique_ptr<KvPool> OwnPool(const Config& config, uint32_t context) {
  Result<std::unique_ptr<KvPool>> pool = KvPool::Make(config, KvPoolBlocks(context, 1));
  if (!pool.ok()) throw std::bad_alloc();
  return std::move(*pool);
}

}  // namespace

KvCache::KvCache(const Config& config, uint32_t context)
    : own_(OwnPool(config, context)), pool_(own_.get()), context_(context) {}

KvCache::KvCache(KvPool& pool, uint32_t context) : pool_(&pool), context_(context) {}

KvCache::~KvCache() { Clear(); }

Status KvCache::Prepare(uint32_t start, uint32_t end) {
  if (start > length_) {
    return Error(Code::kInvalidArgument, "position {} follows a KV cache of {} positions: no gap can be left", start,
                 length_);
  }
  if (end > context_ || start >= end) {
    return Error(Code::kInvalidArgument, "positions {} to {} are past the context of {} tokens", start,
                 uint64_t{end} - 1, context_);
  }
  KvBlocks& blocks = pool_->blocks();
  const uint32_t first = start / kKvBlockTokens;
  const uint32_t last = (end - 1) / kKvBlockTokens;
  for (uint32_t i = first; i <= last && i < table_.size(); ++i) {
    const uint32_t block = table_[i];
    if (blocks.holders(block) == 1) {
      // Its only holder rewrites it: it keeps that prefix no longer, and its generation moves on
      // so that no record after it leads on from it. Appended to (the positions it holds stay as
      // they are), it stays what it is, and so does its record.
      if (start < length_ || blocks.published(block)) blocks.Unpublish(block);
      continue;
    }
    // Others read it (a prefix they share): this cache writes into a copy of its own. A shared
    // block means the pool has one to spare (KvPoolBlocks counts each cache's blocks whole).
    const std::optional<uint32_t> copy = blocks.Take();
    if (!copy) return Error(Code::kResourceExhausted, "the KV cache's {} blocks are all in use", blocks.count());
    if (Status s = pool_->Copy(block, Taken(*copy)); !s.ok()) {
      blocks.Release(*copy);  // the table still names the shared block, whose positions stay good
      return s;
    }
    blocks.Release(block);
    table_[i] = *copy;
  }
  sealed_ = std::min(sealed_, first);
  // Positions from start on are about to change: until Commit they hold nothing the cache vouches
  // for (a pass failing halfway would otherwise leave old tokens named over new keys and values).
  length_ = std::min(length_, start);
  tokens_.resize(length_);
  // The records of the blocks about to be written say so before anything is (kv_region.h); a block
  // taken below claims nothing already (Taken), and those after `last` are not written.
  Describe(first, std::min<uint32_t>(last + 1, static_cast<uint32_t>(table_.size())));
  while (table_.size() <= last) {
    const std::optional<uint32_t> block = blocks.Take();
    if (!block) {
      return Error(Code::kResourceExhausted,
                   "the KV cache's {} blocks are all in use by the sequences running (more than parallel x "
                   "context positions asked for)",
                   blocks.count());
    }
    table_.push_back(Taken(*block));
  }
  return OkStatus();
}

void KvCache::Commit(uint32_t start, std::span<const int32_t> tokens, bool publish) {
  const auto end = static_cast<uint32_t>(start + tokens.size());
  if (tokens_.size() < end) tokens_.resize(end);
  std::copy(tokens.begin(), tokens.end(), tokens_.begin() + start);
  length_ = end;
  if (!publish) private_from_ = std::min(private_from_, start / kKvBlockTokens);
  Describe(start / kKvBlockTokens, (end - 1) / kKvBlockTokens + 1);  // after every layer wrote them
  KvBlocks& blocks = pool_->blocks();
  for (; (sealed_ + 1) * kKvBlockTokens <= length_; ++sealed_) {
    if (!publish) continue;
    const KvBlocks::Link parent = sealed_ == 0 ? KvBlocks::kRoot : blocks.LinkOf(table_[sealed_ - 1]);
    // Unpublished (another sequence published the same prefix first, say), the blocks after it
    // cannot be found either: Publish refuses them for want of a published parent.
    blocks.Publish(table_[sealed_], parent,
                   std::span<const int32_t>(tokens_).subspan(uint64_t{sealed_} * kKvBlockTokens, kKvBlockTokens));
  }
}

uint32_t KvCache::Reuse(std::span<const int32_t> tokens, uint32_t most) {
  Clear();
  KvBlocks& blocks = pool_->blocks();
  most = std::min<uint64_t>({most, tokens.size(), context_});
  KvBlocks::Link parent = KvBlocks::kRoot;
  while ((table_.size() + 1) * kKvBlockTokens <= most) {
    const std::optional<uint32_t> block =
        blocks.Find(parent, tokens.subspan(table_.size() * kKvBlockTokens, kKvBlockTokens));
    if (!block) break;
    table_.push_back(*block);
    parent = blocks.LinkOf(*block);
  }
  length_ = sealed_ = static_cast<uint32_t>(table_.size());
  length_ *= kKvBlockTokens;
  tokens_.assign(tokens.begin(), tokens.begin() + length_);
  return length_;
}

uint32_t KvCache::Import(const KvRegion& source, std::span<const int32_t> tokens, uint32_t most) {
  if (!pool_->floats_here() || source.data() == nullptr || source.element() != pool_->element()) return length_;
  KvRegion& own = pool_->region();
  return Import(source, tokens, most, [&](std::span<const Rows> rows) {
    // Opened as this pool's shape (OpenKvSource), the source holds elements of the same size.
    const uint64_t size = own.element_bytes();
    auto* to = static_cast<uint8_t*>(own.data());
    const auto* from = static_cast<const uint8_t*>(source.data());
    for (const Rows& r : rows) std::memcpy(to + r.to * size, from + r.from * size, r.elements * size);
    return OkStatus();
  });
}

uint32_t KvCache::Import(const KvRegion& source, std::span<const int32_t> tokens, uint32_t most,
                         const RowsCopy& copy) {
  most = static_cast<uint32_t>(std::min<uint64_t>({most, tokens.size(), context_}));
  const std::vector<KvRegion::Extent> run = source.Longest(tokens, most);
  uint32_t end = 0;
  for (const KvRegion::Extent& e : run) end += e.count;
  if (end <= length_ || !Prepare(length_, end).ok()) return length_;
  const uint32_t start = length_;
  const KvRegion& own = pool_->region();
  std::vector<Rows> rows;
  for (uint32_t i = start / kKvBlockTokens; i < run.size(); ++i) {
    // Positions [from, to) of block i: the same offsets in the source's block and in this cache's.
    const uint32_t from = std::max(start, i * kKvBlockTokens) % kKvBlockTokens;
    const uint32_t to = run[i].count;
    if (from == 0 && to == kKvBlockTokens) {  // a whole block: its every layer's rows, one run
      rows.push_back({source.RowsAt(run[i].block, 0, 0, 0), own.RowsAt(table_[i], 0, 0, 0), own.BlockElements()});
      continue;
    }
    for (uint32_t layer = 0; layer < pool_->layers(); ++layer) {
      for (uint32_t half = 0; half < 2; ++half) {
        rows.push_back({source.RowsAt(run[i].block, layer, half, from), own.RowsAt(table_[i], layer, half, from),
                        uint64_t{to - from} * pool_->kv_size()});
      }
    }
  }
  // Prepared, the cache holds the positions before start alone: a failed copy commits nothing.
  if (!copy(rows).ok()) return length_;
  Commit(start, tokens.subspan(start, end - start), /*publish=*/false);
  return length_;
}

void KvCache::Describe(uint32_t first, uint32_t end) {
  const KvBlocks& blocks = pool_->blocks();
  for (uint32_t i = first; i < end && i < table_.size(); ++i) {
    const uint32_t begin = i * kKvBlockTokens;
    const uint32_t count = length_ > begin ? std::min(length_ - begin, kKvBlockTokens) : 0;
    pool_->region().Describe(blocks.LinkOf(table_[i]), i == 0 ? KvBlocks::kRoot : blocks.LinkOf(table_[i - 1]),
                             std::span<const int32_t>(tokens_).subspan(begin, count),
                             i >= private_from_ ? kKvRecordPrivate : 0);
  }
}

uint32_t KvCache::Taken(uint32_t block) {
  pool_->region().Describe(pool_->blocks().LinkOf(block), KvBlocks::kRoot, {});
  return block;
}

void KvCache::Clear() {
  // The last block first: a prefix's blocks return to the cache child before parent, so that the
  // least recently used goes first means a prefix is shortened from its end, not cut at its start.
  for (auto it = table_.rbegin(); it != table_.rend(); ++it) pool_->blocks().Release(*it);
  table_.clear();
  tokens_.clear();
  length_ = sealed_ = 0;
  private_from_ = UINT32_MAX;
}

}  // namespace warmpool::transformer
