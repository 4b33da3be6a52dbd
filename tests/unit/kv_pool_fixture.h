// What the KV cache's tests (kv_cache_test.cc, kv_region_test.cc) build their pools of: a model
// shape of 2 layers and one KV head of 4 floats, small enough that a block's numbers can be read.
#pragma once

#include <gtest/gtest.h>

#include <memory>

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

}  // namespace warmpool::transformer::kv_fixture
