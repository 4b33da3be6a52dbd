// A model's keys and values on the CPU, in fixed blocks (a paged KV cache; the bookkeeping is
// KvBlocks, engines/transformer/kv_blocks.h). KvPool holds the blocks of one model, which its
// sequences share; KvCache is one sequence's positions, a table of the pool's blocks.
//
// A block holds kKvBlockTokens positions of every layer: [layer][keys, values][position][kv head]
// [head_dim], f32 or bf16 (Config::kv_element, the pool's element()). Within a block, a layer's
// keys (and values) at consecutive positions are consecutive rows of kv_size elements, so attention
// reads them as one strided matrix per block (Contiguous says how far one reaches).
//
// A cache's positions 0 .. length() - 1 hold keys and values. Prepare makes room to write, Commit
// records what was written; full blocks then join the prefix cache, and Reuse starts a new sequence
// from published blocks of its prompt's prefix.
#pragma once

#include <cassert>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "engines/transformer/config.h"
#include "engines/transformer/kv_blocks.h"
#include "engines/transformer/kv_region.h"

namespace warmpool::transformer {

// The blocks a pool needs so that `sequences` caches of `context` positions always find theirs:
// each holds at most ceil(context / kKvBlockTokens), and a shared block counts once. With
// `kv_tokens` (0: none), the blocks of that many positions instead, at least one context's (a
// request the context holds then always fits once the others close) and at most the above.
uint32_t KvPoolBlocks(uint32_t context, uint32_t sequences, uint64_t kv_tokens = 0);
// The blocks of `positions` positions.
inline uint32_t KvBlocksOf(uint64_t positions) {
  return static_cast<uint32_t>((positions + kKvBlockTokens - 1) / kKvBlockTokens);
}

class KvPool {
 public:
  // Its memory is a KvRegion (kv_region.h), which the worker may hand to the supervisor: its pages
  // are the system's once first written, and stay (admission counts the whole pool, whatever is
  // touched). RESOURCE_EXHAUSTED when the memory cannot be had.
  static Result<std::unique_ptr<KvPool>> Make(const Config& config, uint32_t blocks);
  // The pool an earlier instance of this model exported (export_cache) and left cleanly — parked,
  // or its daemon restarted — taken over as this one's: the region becomes its memory, and every
  // prefix its records show whole (full blocks, each after its parent, from the first) is in its
  // prefix cache again; whatever else is there is free. INVALID_ARGUMENT when the region is not a
  // pool of this model's shape and `blocks` blocks (KvRegion::Adopt).
  static Result<std::unique_ptr<KvPool>> Adopt(const Config& config, uint32_t blocks, int handle, uint64_t bytes);
  // A pool whose keys and values live elsewhere, in the layout a KvRegion's RowsAt gives (a GPU's
  // memory, engines/transformer/gpu_slots.h): only its bookkeeping and records are here (a
  // records-only region, mirrored there: KvRegion::ImageWrites), and `copy` copies one block's keys
  // and values to another there, given the records so that it can mirror them first (the block
  // copied into claims nothing there before the copy lands). An error: the copy was not made.
  // Such a pool's caches import through a copy of their own (Import's second form).
  using BlockCopy = std::function<Status(KvRegion& records, uint32_t from, uint32_t to)>;
  static Result<std::unique_ptr<KvPool>> MakeElsewhere(const Config& config, uint32_t blocks, BlockCopy copy);
  // Such a pool, before any cache takes a block, told what `source` (a whole region of this shape:
  // a parked pool's host copy) holds: the records, and from them the prefix cache, as Adopt keeps
  // them. The keys and values must be in place elsewhere first: the records then claim them.
  void AdoptRecords(const KvRegion& source);
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  uint32_t layers() const { return layers_; }
  uint32_t kv_size() const { return kv_size_; }
  KvElement element() const { return region_.element(); }
  KvBlocks& blocks() { return blocks_; }
  const KvBlocks& blocks() const { return blocks_; }
  // The keys and values are in this process's memory, at region().data().
  bool floats_here() const { return region_.data() != nullptr; }
  KvRegion& region() { return region_; }
  const KvRegion& region() const { return region_; }
  // Where a block's keys (half 0) or values (half 1) of `layer` at `offset` begin, as the pool's
  // element (key and value: f32 pools only; the _bf16 forms: bf16 pools only).
  float* key(uint32_t block, uint32_t layer, uint32_t offset) { return At<float>(block, layer, 0, offset); }
  float* value(uint32_t block, uint32_t layer, uint32_t offset) { return At<float>(block, layer, 1, offset); }
  uint16_t* key_bf16(uint32_t block, uint32_t layer, uint32_t offset) { return At<uint16_t>(block, layer, 0, offset); }
  uint16_t* value_bf16(uint32_t block, uint32_t layer, uint32_t offset) {
    return At<uint16_t>(block, layer, 1, offset);
  }
  // Every layer's keys and values of `from` into `to` (a shared block copied before it is written).
  Status Copy(uint32_t from, uint32_t to);

 private:
  KvPool(const Config& config, uint32_t blocks, KvRegion region);
  // Adopt's second half: the prefix cache from the region's records, which then say no more.
  void RestorePrefixes();
  template <class T>
  T* At(uint32_t block, uint32_t layer, uint32_t half, uint32_t offset) {
    assert(sizeof(T) == region_.element_bytes());
    return static_cast<T*>(region_.data()) + region_.RowsAt(block, layer, half, offset);
  }
  uint32_t layers_;
  uint32_t kv_size_;
  KvBlocks blocks_;
  KvRegion region_;
  BlockCopy copy_elsewhere_;  // set: the keys and values are not here (MakeElsewhere)
};

class KvCache {
 public:
  // A cache with a pool of its own, for one sequence of `context` positions.
  KvCache(const Config& config, uint32_t context);
  // A cache whose blocks come from `pool` (which outlives it) as it grows.
  KvCache(KvPool& pool, uint32_t context);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  uint32_t context() const { return context_; }
  uint32_t length() const { return length_; }
  KvPool& pool() { return *pool_; }
  bool Fits(const Config& config) const {
    return pool_->layers() == config.num_hidden_layers && pool_->kv_size() == config.kv_size() &&
           pool_->element() == config.kv_element;
  }

  // Room to write positions start .. end - 1 (start <= length(), end <= context()): blocks taken
  // from the pool, and a block among them that is published (or shared) unpublished (or copied)
  // first, since its keys and values are about to change. From then on the cache holds only the
  // positions before start (length() is start at most) until Commit says what was written: a
  // pass that fails halfway leaves no half-written position counted, nor published later.
  // INVALID_ARGUMENT past the context or after a gap, RESOURCE_EXHAUSTED when the pool has no
  // block left; nothing written either way.
  Status Prepare(uint32_t start, uint32_t end);
  // Positions start .. start + tokens.size() - 1 now hold these tokens' keys and values in every
  // layer (after Prepare, once every layer wrote them): length() becomes their end, and the blocks
  // they fill are published for later sequences to reuse.
  // With `publish` false, the blocks it fills are not published, their records say so for any
  // instance that adopts the pool later (kKvRecordPrivate), nor (lacking a published parent)
  // any after them in this cache.
  void Commit(uint32_t start, std::span<const int32_t> tokens, bool publish = true);
  // An empty cache (its blocks released) that starts with the longest published prefix of `tokens`
  // that is whole blocks and at most `most` positions: returns its length, the positions reused.
  uint32_t Reuse(std::span<const int32_t> tokens, uint32_t most);
  // After Reuse: the positions from length() on that `source` (a dead worker's pool of this model,
  // kv_region.h) holds of `tokens`, at most `most` of them, copied into this cache's blocks instead
  // of computed. Returns the length now. Copies nothing when the pool has no blocks to spare.
  // What it copies serves this sequence alone: a dead worker may have died of a fault that wrote
  // anything into its memory, so none of it joins the prefix cache.
  uint32_t Import(const KvRegion& source, std::span<const int32_t> tokens, uint32_t most);
  // The same where the keys and values are elsewhere, the source's and this pool's alike (a GPU's, whose
  // source is a records-only region read back, KvRegion::FromImage): `copy` copies the rows, given
  // as element offsets into the source's region and this pool's (RowsAt). A copy that fails leaves
  // the cache as Reuse left it.
  struct Rows {
    uint64_t from;
    uint64_t to;
    uint64_t elements;
  };
  using RowsCopy = std::function<Status(std::span<const Rows>)>;
  uint32_t Import(const KvRegion& source, std::span<const int32_t> tokens, uint32_t most, const RowsCopy& copy);
  // Empty: its blocks released (the published ones stay cached for later sequences).
  void Clear();

  // A position's keys or values (kv_size elements) in `layer`; within a block the next position's
  // follow, kv_size elements on. The position must be prepared. As the pool's element: key and
  // value for f32, the _bf16 forms for bf16.
  KvElement element() const { return pool_->element(); }
  float* key(uint32_t layer, uint32_t position) {
    return pool_->key(table_[position / kKvBlockTokens], layer, position % kKvBlockTokens);
  }
  float* value(uint32_t layer, uint32_t position) {
    return pool_->value(table_[position / kKvBlockTokens], layer, position % kKvBlockTokens);
  }
  uint16_t* key_bf16(uint32_t layer, uint32_t position) {
    return pool_->key_bf16(table_[position / kKvBlockTokens], layer, position % kKvBlockTokens);
  }
  uint16_t* value_bf16(uint32_t layer, uint32_t position) {
    return pool_->value_bf16(table_[position / kKvBlockTokens], layer, position % kKvBlockTokens);
  }
  // The blocks it holds, in position order (block i holds positions i x kKvBlockTokens on).
  std::span<const uint32_t> blocks() const { return table_; }
  // How many positions from `position` (before `end`) lie in its block, one after another.
  static uint32_t Contiguous(uint32_t position, uint32_t end) {
    return std::min(end, (position / kKvBlockTokens + 1) * kKvBlockTokens) - position;
  }

 private:
  std::unique_ptr<KvPool> own_;
  KvPool* pool_;
  uint32_t context_;
  std::vector<uint32_t> table_;  // the block of positions [i, i + 1) x kKvBlockTokens
  std::vector<int32_t> tokens_;  // the token at each position written
  uint32_t length_ = 0;
  uint32_t sealed_ = 0;          // full blocks, from the first, whose publication was tried
  // The first block committed unpublished (an import from a dead worker's region): it and every
  // block after it are described private (kKvRecordPrivate), so that no later instance that adopts
  // the region keeps them in its prefix cache either. Until Clear.
  uint32_t private_from_ = UINT32_MAX;
  // The records of blocks table_[first] .. table_[end - 1], as length_ and tokens_ now say
  // (kv_region.h).
  void Describe(uint32_t first, uint32_t end);
  // A block just taken, to be written: its record claims nothing any more.
  uint32_t Taken(uint32_t block);
};

}  // namespace warmpool::transformer
