// The bookkeeping of a paged KV cache: a model's keys and values in fixed blocks of kKvBlockTokens
// positions, shared by its sequences (engines/transformer/kv_cache.h holds the keys and values). A block is
// in exactly one of three states:
//   free      nobody holds it and it keeps nothing;
//   held      one or more sequences hold it (several: a prompt prefix they share);
//   cached    nobody holds it, but it keeps a prefix for requests to come (the prefix cache).
// A block full of a prefix's positions is published under that prefix: its parent (the block before
// it in the prefix, as it was when published) and its own tokens. A sequence whose prompt starts with
// the same tokens then takes the published blocks instead of computing them again. A published
// block's keys and values never change while it stays published; its holder rewriting it
// unpublishes it first (Unpublish), and a block several hold is copied instead (the caller's part).
// Cached blocks are evicted least recently used first, when a free block is wanted.
//
// Why a parent is named by block and generation: a block's generation grows whenever it takes new
// content, so a published block whose parent was evicted and reused can no longer be found from
// the new content (it could otherwise extend a prefix it does not belong to); it ages out instead.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

namespace warmpool::transformer {

inline constexpr uint32_t kKvBlockTokens = 64;

// A block as a prefix's link names it: the first block of a prefix has no parent (the root link).
struct KvLink {
  static constexpr uint32_t kNone = UINT32_MAX;
  uint32_t block = kNone;
  uint32_t generation = 0;
  bool operator==(const KvLink&) const = default;
};

class KvBlocks {
 public:
  using Link = KvLink;
  static constexpr Link kRoot{};

  explicit KvBlocks(uint32_t count);
  uint32_t count() const { return static_cast<uint32_t>(blocks_.size()); }

  // A block to write new content into, held once: a free one (lowest first, so that a pool's memory
  // is touched from its start), else the least recently used cached one, evicted. nullopt when
  // every block is held.
  std::optional<uint32_t> Take();
  // One holder fewer. A block nobody holds any more is cached when published, else free.
  void Release(uint32_t block);
  // The block as its children link to it now.
  Link LinkOf(uint32_t block) const { return {block, blocks_[block].generation}; }

  // Publishes a held block full of `tokens` (kKvBlockTokens of them) after `parent`. False when it
  // cannot be: the same prefix is published already (another sequence computed it too), or its
  // parent is not (a prefix is found from its first block on).
  bool Publish(uint32_t block, Link parent, std::span<const int32_t> tokens);
  // The published block for `tokens` after `parent`, now held once more by the caller (no longer
  // cached); nullopt when there is none.
  std::optional<uint32_t> Find(Link parent, std::span<const int32_t> tokens);
  // Before its only holder rewrites it: no longer published, and a new generation (whether it was
  // published or not), so that nothing linked to its old content — a published child, a record in
  // the pool's region (kv_region.h) — leads to the new.
  void Unpublish(uint32_t block);

  // A new pool's blocks (every one free) made to keep what an earlier pool of this model kept in
  // the same memory (KvPool::Adopt): each block of `kept` published under its parent and tokens,
  // and cached, in the order listed — parents first, so that a block whose parent is not kept is
  // not kept either; the last listed is the first evicted. Every block takes its generation from
  // `generations` (a kept one from its entry). Returns how many blocks are kept.
  struct Kept {
    uint32_t block;
    uint32_t generation;
    Link parent;
    std::span<const int32_t> tokens;
  };
  uint32_t Restore(std::span<const Kept> kept, std::span<const uint32_t> generations);

  uint32_t holders(uint32_t block) const { return blocks_[block].holders; }
  bool published(uint32_t block) const { return blocks_[block].published; }

  struct Counts {
    uint32_t free = 0;
    uint32_t held = 0;
    uint32_t cached = 0;
  };
  Counts counts() const { return {static_cast<uint32_t>(free_.size()), held_, static_cast<uint32_t>(lru_.size())}; }
  // Every block in exactly one state, the prefix index naming exactly the published blocks, each
  // cached block published and unheld: the invariants, checked (tests; a false is a bug here).
  bool Consistent() const;

 private:
  struct Block {
    uint32_t holders = 0;
    uint32_t generation = 0;
    bool published = false;
    Link parent;
    uint64_t key = 0;                            // the prefix index's, while published
    std::vector<int32_t> tokens;                 // while published
    std::list<uint32_t>::iterator lru;           // while cached
  };
  static uint64_t KeyOf(Link parent, std::span<const int32_t> tokens);
  void Forget(uint32_t block);  // out of the prefix index, a new generation

  std::vector<Block> blocks_;
  std::vector<uint32_t> free_;  // a stack: the lowest block on top
  std::list<uint32_t> lru_;     // cached blocks, the least recently used first
  std::unordered_map<uint64_t, uint32_t> index_;  // prefix key -> published block
  uint32_t held_ = 0;
};

}  // namespace warmpool::transformer
