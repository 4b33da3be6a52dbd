// What the KV cache's tests (kv_cache_test.cc, kv_region_test.cc) build their pools of: a model
// shape of 2 layers and one KV head of 4 floats, small enough that a block's numbers can be read,
// and passes that write keys and values a test can tell apart.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engines/transformer/kv_cache.h"

namespace warmpool::transformer::kv_fixture {

inline Config SmallShape() {
  Config c;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  return c;
}

inline std::unique_ptr<KvPool> PoolOf(const Config& c, uint32_t blocks) {
  Result<std::unique_ptr<KvPool>> pool = KvPool::Make(c, blocks);
  EXPECT_TRUE(pool.ok()) << pool.status().ToString();
  return pool.ok() ? std::move(*pool) : nullptr;
}

// What a real pass computes at a position depends on every token up to it: so do these keys.
inline float KeyOf(const std::vector<int32_t>& tokens, uint32_t position, uint32_t layer) {
  uint64_t h = 1469598103934665603ull + layer;
  for (uint32_t i = 0; i <= position; ++i) h = (h ^ static_cast<uint32_t>(tokens[i])) * 1099511628211ull;
  return static_cast<float>(h % 1000003);
}

inline void WriteAt(KvCache& cache, const std::vector<int32_t>& tokens, uint32_t position) {
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint32_t d = 0; d < 4; ++d) {
      cache.key(layer, position)[d] = KeyOf(tokens, position, layer) + static_cast<float>(d);
      cache.value(layer, position)[d] = -KeyOf(tokens, position, layer) - static_cast<float>(d);
    }
  }
}

// A whole pass: positions start .. tokens.size() - 1 prepared, written, committed.
inline void Pass(KvCache& cache, const std::vector<int32_t>& tokens, uint32_t start) {
  ASSERT_TRUE(cache.Prepare(start, static_cast<uint32_t>(tokens.size())).ok());
  for (uint32_t p = start; p < tokens.size(); ++p) WriteAt(cache, tokens, p);
  cache.Commit(start, std::span<const int32_t>(tokens).subspan(start));
}

inline std::vector<int32_t> Tokens(int32_t first, uint32_t count) {
  std::vector<int32_t> t(count);
  for (uint32_t i = 0; i < count; ++i) t[i] = first + static_cast<int32_t>(i);
  return t;
}

}  // namespace warmpool::transformer::kv_fixture
