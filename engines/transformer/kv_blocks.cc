#include "engines/transformer/kv_blocks.h"

#include <algorithm>
#include <cassert>

namespace warmpool::transformer {

KvBlocks::KvBlocks(uint32_t count) : blocks_(count) {
  free_.reserve(count);
  for (uint32_t b = count; b > 0; --b) free_.push_back(b - 1);
}

uint64_t KvBlocks::KeyOf(Link parent, std::span<const int32_t> tokens) {
  // FNV-1a over the parent's link and the tokens. A key only finds a candidate: Find compares the
  // parent and the tokens themselves, so a collision costs a cache miss, never a wrong answer.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(parent.block);
  mix(parent.generation);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  return h;
}

std::optional<uint32_t> KvBlocks::Take() {
  uint32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    block = lru_.front();
    lru_.pop_front();
    Forget(block);
  } else {
    return std::nullopt;
  }
  Block& b = blocks_[block];
  b.generation++;  // new content: whatever linked to the old one no longer finds it
  b.holders = 1;
  held_++;
  return block;
}

void KvBlocks::Release(uint32_t block) {
  Block& b = blocks_[block];
  assert(b.holders > 0);
  if (--b.holders > 0) return;
  held_--;
  if (b.published) {
    b.lru = lru_.insert(lru_.end(), block);
  } else {
    free_.push_back(block);
  }
}

bool KvBlocks::Publish(uint32_t block, Link parent, std::span<const int32_t> tokens) {
  Block& b = blocks_[block];
  if (b.published || b.holders == 0 || tokens.size() != kKvBlockTokens) return false;
  if (parent != kRoot && (parent.block >= blocks_.size() || !blocks_[parent.block].published ||
                          blocks_[parent.block].generation != parent.generation)) {
    return false;
  }
  const uint64_t key = KeyOf(parent, tokens);
  if (!index_.emplace(key, block).second) return false;
  b.published = true;
  b.parent = parent;
  b.key = key;
  b.tokens.assign(tokens.begin(), tokens.end());
  return true;
}

std::optional<uint32_t> KvBlocks::Find(Link parent, std::span<const int32_t> tokens) {
  if (tokens.size() != kKvBlockTokens) return std::nullopt;
  const auto it = index_.find(KeyOf(parent, tokens));
  if (it == index_.end()) return std::nullopt;
  Block& b = blocks_[it->second];
  if (b.parent != parent || !std::equal(tokens.begin(), tokens.end(), b.tokens.begin())) return std::nullopt;
  if (b.holders++ == 0) {
    lru_.erase(b.lru);
    held_++;
  }
  return it->second;
}

void KvBlocks::Unpublish(uint32_t block) {
  Block& b = blocks_[block];
  assert(b.holders == 1);
  Forget(block);
  b.generation++;
}

void KvBlocks::Forget(uint32_t block) {
  Block& b = blocks_[block];
  if (!b.published) return;
  index_.erase(b.key);
  b.published = false;
  b.tokens.clear();
}

uint32_t KvBlocks::Restore(std::span<const Kept> kept, std::span<const uint32_t> generations) {
  assert(held_ == 0 && lru_.empty() && index_.empty());
  for (uint32_t b = 0; b < blocks_.size() && b < generations.size(); ++b) blocks_[b].generation = generations[b];
  uint32_t restored = 0;
  for (const Kept& k : kept) {
    if (k.block >= blocks_.size() || blocks_[k.block].published) continue;
    Block& b = blocks_[k.block];
    b.generation = k.generation;
    b.holders = 1;  // Publish takes a held block (as a sequence's would be)
    const bool published = Publish(k.block, k.parent, k.tokens);
    b.holders = 0;
    if (!published) continue;
    b.lru = lru_.insert(lru_.begin(), k.block);
    restored++;
  }
  free_.clear();
  for (auto b = static_cast<uint32_t>(blocks_.size()); b > 0; --b) {
    if (!blocks_[b - 1].published) free_.push_back(b - 1);
  }
  return restored;
}

bool KvBlocks::Consistent() const {
  std::vector<int> state(blocks_.size(), 0);  // 1 free, 2 held, 3 cached
  for (uint32_t b : free_) {
    if (b >= blocks_.size() || state[b] != 0) return false;
    state[b] = 1;
  }
  for (uint32_t b : lru_) {
    if (b >= blocks_.size() || state[b] != 0) return false;
    state[b] = 3;
  }
  uint32_t held = 0, published = 0;
  for (uint32_t b = 0; b < blocks_.size(); ++b) {
    const Block& block = blocks_[b];
    if (block.holders > 0) {
      if (state[b] != 0) return false;  // held and free or cached at once
      state[b] = 2;
      held++;
    }
    if (state[b] == 0) return false;                           // in no state
    if (state[b] == 1 && block.published) return false;         // free, yet published
    if (state[b] == 3 && !block.published) return false;        // cached, yet keeps nothing
    if (block.published) {
      published++;
      const auto it = index_.find(block.key);
      if (it == index_.end() || it->second != b) return false;
    }
  }
  return held == held_ && published == index_.size();
}

}  // namespace warmpool::transformer
