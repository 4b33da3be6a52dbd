// A prompt's attention as matrix products (engines/transformer/prompt_attention.h) and a decode
// row's (decode_attention.h) against the definition, written here in double precision: each row's
// softmax(q·k / sqrt(head_dim)) over the positions it sees (causal, within the sliding window)
// weighing their values. Tiles of rows, a cache already holding earlier positions (over several of
// its blocks), grouped heads, and values that are not finite; in caches of f32 and of bf16 (whose
// keys and values the definition takes as stored: rounded, to nearest even, as written here).
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "engines/transformer/decode_attention.h"
#include "engines/transformer/prompt_attention.h"

namespace warmpool::transformer {
namespace {

struct AttentionCase {
  uint32_t rows, start;
  uint64_t window;
  int threads;
};

std::vector<double> AttentionByDefinition(const Config& c, uint32_t rows, uint32_t start, const std::vector<float>& keys,
                               const std::vector<float>& values, const std::vector<float>& q) {
  std::vector<double> out(uint64_t{rows} * c.q_size());
  const uint32_t group = c.num_attention_heads / c.num_key_value_heads;
  for (uint32_t r = 0; r < rows; ++r) {
    const uint32_t position = start + r;
    const uint32_t first = c.sliding_window != 0 && position + 1 > c.sliding_window
                               ? static_cast<uint32_t>(position + 1 - c.sliding_window)
                               : 0;
    for (uint32_t h = 0; h < c.num_attention_heads; ++h) {
      const uint64_t kv = uint64_t{h / group} * c.head_dim;
      std::vector<double> scores;
      for (uint32_t j = first; j <= position; ++j) {
        double dot = 0;
        for (uint32_t d = 0; d < c.head_dim; ++d) {
          dot += double{q[uint64_t{r} * c.q_size() + h * c.head_dim + d]} * keys[uint64_t{j} * c.kv_size() + kv + d];
        }
        scores.push_back(dot / std::sqrt(double(c.head_dim)));
      }
      double max = -INFINITY, total = 0;
      for (double s : scores) max = std::max(max, s);
      for (double& s : scores) total += (s = std::exp(s - max));
      for (uint32_t j = first; j <= position; ++j) {
        for (uint32_t d = 0; d < c.head_dim; ++d) {
          out[uint64_t{r} * c.q_size() + h * c.head_dim + d] +=
              scores[j - first] / total * values[uint64_t{j} * c.kv_size() + kv + d];
        }
      }
    }
  }
  return out;
}

// x as the bf16 nearest to it, ties to the even one (an f32's upper 16 bits, rounded on the lower
// 16; a NaN stays one, and what rounds past the largest finite bf16 is infinite).
float RoundToBF16(float x) {
  if (std::isnan(x)) return x;
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  return std::bit_cast<float>((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
}

// The elements a cache can have here: f32, and bf16 where this CPU keeps it for this head size.
std::vector<KvElement> ElementsHere(uint32_t head_dim) {
  if (!HaveBF16KvCache(head_dim)) return {KvElement::kF32};
  return {KvElement::kF32, KvElement::kBF16};
}

// A one-layer cache of c.kv_element holding these keys and values (position-major, kv_size floats
// each): in a bf16 cache rounded, and rounded here too, so that they are what the cache holds.
std::unique_ptr<KvCache> CacheOf(const Config& c, std::vector<float>& keys, std::vector<float>& values) {
  const auto positions = static_cast<uint32_t>(keys.size() / c.kv_size());
  auto cache = std::make_unique<KvCache>(c, positions);
  EXPECT_TRUE(cache->Prepare(0, positions).ok());
  const bool bf16 = c.kv_element == KvElement::kBF16;
  for (uint32_t j = 0; j < positions; ++j) {
    for (uint32_t i = 0; i < c.kv_size(); ++i) {
      for (auto [all, half] : {std::pair{&keys, 0}, std::pair{&values, 1}}) {
        float& x = (*all)[uint64_t{j} * c.kv_size() + i];
        if (!bf16) {
          (half == 0 ? cache->key(0, j) : cache->value(0, j))[i] = x;
          continue;
        }
        x = RoundToBF16(x);
        (half == 0 ? cache->key_bf16(0, j) : cache->value_bf16(0, j))[i] =
            static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16);
      }
    }
  }
  cache->Commit(0, std::vector<int32_t>(positions, 0));
  return cache;
}

// c's name for a failure: its cache's element.
std::string ElementName(const Config& c) { return c.kv_element == KvElement::kBF16 ? "bf16" : "f32"; }

// PromptAttention or DecodeAttention.
using AttentionFn = Status (*)(const Config&, uint32_t, uint32_t, uint32_t, KvCache&, const float*, float*, int);

// `attention` of random queries, keys and values within 1e-5 (relative, plus absolute) of the
// definition, for case k in config c.
void ExpectTheDefinition(AttentionFn attention, const Config& c, const AttentionCase& k, std::mt19937& generator,
                         const std::string& context) {
  std::uniform_real_distribution<float> uniform(-2, 2);
  const uint32_t positions = k.start + k.rows;
  std::vector<float> keys(uint64_t{positions} * c.kv_size()), values(keys.size()), q(uint64_t{k.rows} * c.q_size());
  for (float& x : keys) x = uniform(generator);
  for (float& x : values) x = uniform(generator);
  for (float& x : q) x = uniform(generator);
  std::vector<float> out(q.size(), NAN);
  const std::unique_ptr<KvCache> cache = CacheOf(c, keys, values);
  ASSERT_TRUE(attention(c, 0, k.rows, k.start, *cache, q.data(), out.data(), k.threads).ok()) << context;
  const std::vector<double> want = AttentionByDefinition(c, k.rows, k.start, keys, values, q);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want[i], 1e-5 * (1 + std::fabs(want[i])))
        << context << ", " << ElementName(c) << " cache; rows " << k.rows << " start " << k.start << " window "
        << k.window << " threads " << k.threads << " at " << i;
  }
}

struct HeadShape {
  uint32_t heads, kv_heads, head_dim;
};

// ExpectTheDefinition for every case in a one-layer config of every shape, on every cache element
// this CPU keeps for its head size.
void ExpectTheDefinitionForEach(AttentionFn attention, std::span<const HeadShape> shapes,
                                std::span<const AttentionCase> cases, uint32_t seed, const std::string& name) {
  std::mt19937 generator(seed);
  for (const HeadShape& shape : shapes) {
    Config c;
    c.num_hidden_layers = 1;
    c.num_attention_heads = shape.heads;
    c.num_key_value_heads = shape.kv_heads;
    c.head_dim = shape.head_dim;
    for (KvElement element : ElementsHere(c.head_dim)) {
      c.kv_element = element;
      for (const AttentionCase& k : cases) {
        c.sliding_window = k.window;
        ExpectTheDefinition(attention, c, k, generator,
                            fmt::format("{}, {} heads of {} over {} KV heads", name, shape.heads, shape.head_dim,
                                        shape.kv_heads));
      }
    }
  }
}

// The query heads that share a KV head go into one product, a chunk of rows at a time (64 query
// vectors: 16 rows of a group of 4, 9 of a group of 7), and are split over tasks where there are
// more threads than tiles and KV heads (the last shape on 4 threads: 1, 2, 1 and 2 of 6 heads).
TEST(PromptAttention, EqualsTheDefinitionOverTilesWindowsAndAnEarlierCache) {
  const HeadShape shapes[] = {{4, 2, 16}, {16, 4, 64}, {14, 2, 32}, {6, 1, 16}};
  const AttentionCase cases[] = {{8, 0, 0, 1},    {150, 0, 0, 2},  {70, 37, 0, 2}, {130, 0, 20, 2},
                                 {9, 100, 20, 1}, {64, 64, 3, 3},  {9, 200, 0, 2}, {17, 60, 0, 4}};
  ExpectTheDefinitionForEach(&PromptAttention, shapes, cases, 11, "prompt");
}

// A value that is not finite reaches the rows that see its position, and no other: a row before it
// stays finite (as a product, its zero weight times infinity would have made it NaN).
TEST(PromptAttention, AValueThatIsNotFiniteReachesOnlyTheRowsThatSeeIt) {
  Config c;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  const uint32_t rows = 40;
  std::vector<float> keys(uint64_t{rows} * c.kv_size(), 0.1f), values(keys.size(), 1.0f), q(uint64_t{rows} * c.q_size(), 0.2f);
  for (auto [bad, element] : {std::pair{std::numeric_limits<float>::infinity(), KvElement::kF32},
                              std::pair{std::numeric_limits<float>::quiet_NaN(), KvElement::kF32},
                              std::pair{std::numeric_limits<float>::infinity(), KvElement::kBF16},
                              std::pair{std::numeric_limits<float>::quiet_NaN(), KvElement::kBF16}}) {
    if (element == KvElement::kBF16 && !HaveBF16KvCache(c.head_dim)) continue;
    c.kv_element = element;
    values[uint64_t{30} * c.kv_size() + 3] = bad;  // position 30, dimension 3
    std::vector<float> out(q.size());
    const std::unique_ptr<KvCache> cache = CacheOf(c, keys, values);
    ASSERT_TRUE(PromptAttention(c, 0, rows, 0, *cache, q.data(), out.data(), 2).ok());
    const std::string element_name = ElementName(c);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t h = 0; h < c.num_attention_heads; ++h) {
        for (uint32_t d = 0; d < c.head_dim; ++d) {
          const float x = out[uint64_t{r} * c.q_size() + h * c.head_dim + d];
          if (r < 30 || d != 3) {
            EXPECT_NEAR(x, 1.0f, 1e-5) << element_name << " row " << r << " dimension " << d;  // the mean of ones
          } else {
            EXPECT_FALSE(std::isfinite(x)) << element_name << " row " << r << " sees position 30";
          }
        }
      }
    }
  }
}

// Decode rows (fewer than a prompt piece's) at positions within and across the cache's blocks, with
// sliding windows, on both of DecodeAttention's paths: the AVX-512 kernel (head sizes of a multiple
// of 16, where the CPU has it) and oneDNN's products (20). Groups of 1 to 7 query heads per KV head
// and heads of 1 to 8 vectors (the kernel's tiles are four heads and four vectors: 7 x 80 is a
// tile of 4 x 4, one of 4 x 1, one of 3 x 4 and one of 3 x 1), runs of positions that are not a
// multiple of the four it scores at a time, and more threads than rows (a row's KV heads shared).
TEST(DecodeAttention, EqualsTheDefinitionOnBothPathsForEveryGroupSize) {
  const HeadShape shapes[] = {{4, 2, 16}, {16, 4, 64}, {6, 1, 32}, {8, 8, 48}, {10, 2, 128}, {14, 2, 80}, {4, 2, 20}};
  // The last: one row on 3 threads, its KV heads in three parts (of 4 KV heads: 1, 1 and 2).
  const AttentionCase cases[] = {{1, 0, 0, 1}, {1, 63, 0, 1}, {3, 62, 0, 2}, {7, 200, 0, 3},
                                 {2, 130, 40, 2}, {1, 64, 1, 4}, {1, 100, 0, 3}};
  if (!HaveAttendRuns(16)) std::printf("note: no AVX-512F here, so only the oneDNN path runs\n");
  ExpectTheDefinitionForEach(&DecodeAttention, shapes, cases, 13, "decode");
}

// A step's sequences in one call: each run's rows against its own cache only, of different lengths
// (within a block, across blocks) and row counts, on 1 to 4 threads: fewer than the rows, and more
// (two one-row runs on 4 threads: each row's KV heads in two parts). Both paths (heads of 32 and of
// 20 floats). (At most 4 threads: clang's OpenMP runtime keeps a larger team's per-thread data past
// exit, which LeakSanitizer reports.)
TEST(DecodeAttention, SeveralSequencesInOneCallEachEqualTheDefinition) {
  struct Run {
    uint32_t rows, start;
  };
  const std::vector<Run> many = {{1, 4}, {3, 130}, {2, 63}, {1, 200}}, two = {{1, 4}, {1, 200}};
  std::mt19937 generator(17);
  std::uniform_real_distribution<float> uniform(-2, 2);
  for (auto [head_dim, element] : {std::pair{32u, KvElement::kF32}, std::pair{20u, KvElement::kF32},
                                   std::pair{32u, KvElement::kBF16}}) {
    if (element == KvElement::kBF16 && !HaveBF16KvCache(head_dim)) continue;
    Config c;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 2;
    c.head_dim = head_dim;
    c.kv_element = element;
    for (uint32_t window : {0u, 50u}) {
      c.sliding_window = window;
      for (const auto& [shapes, threads] :
           {std::pair{many, 1}, std::pair{many, 2}, std::pair{many, 3}, std::pair{two, 4}}) {
        std::vector<std::vector<float>> keys, values, q, out;
        std::vector<std::unique_ptr<KvCache>> caches;
        std::vector<DecodeRows> runs;
        for (const Run& shape : shapes) {
          const uint32_t positions = shape.start + shape.rows;
          keys.emplace_back(uint64_t{positions} * c.kv_size());
          values.emplace_back(keys.back().size());
          q.emplace_back(uint64_t{shape.rows} * c.q_size());
          out.emplace_back(q.back().size(), NAN);
          for (auto* v : {&keys.back(), &values.back(), &q.back()}) {
            for (float& x : *v) x = uniform(generator);
          }
          caches.push_back(CacheOf(c, keys.back(), values.back()));
        }
        for (size_t i = 0; i < caches.size(); ++i) {
          runs.push_back({shapes[i].rows, shapes[i].start, caches[i].get(), q[i].data(), out[i].data()});
        }
        ASSERT_TRUE(DecodeAttention(c, 0, runs, threads).ok());
        for (size_t i = 0; i < caches.size(); ++i) {
          const std::vector<double> want =
              AttentionByDefinition(c, shapes[i].rows, shapes[i].start, keys[i], values[i], q[i]);
          for (size_t j = 0; j < want.size(); ++j) {
            ASSERT_NEAR(out[i][j], want[j], 1e-5 * (1 + std::fabs(want[j])))
                << "run " << i << " at " << j << ", " << threads << " threads, window " << window << ", heads of "
                << head_dim << ", " << ElementName(c) << " cache";
          }
        }
      }
    }
  }
}

// A NaN or an infinity reaches what the definition's arithmetic makes it reach and nothing else: a
// value that is not finite, the dimension it is in of every head that reads its KV head; a query
// that is not finite, its own head's output alone.
TEST(DecodeAttention, WhatIsNotFiniteReachesOnlyWhatReadsIt) {
  Config c;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  const uint32_t positions = 100, rows = 3, start = positions - rows;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (auto [head_dim, element] : {std::pair{32u, KvElement::kF32}, std::pair{20u, KvElement::kF32},
                                   std::pair{32u, KvElement::kBF16}}) {  // the kernel, and oneDNN's products
    if (element == KvElement::kBF16 && !HaveBF16KvCache(head_dim)) continue;
    c.head_dim = head_dim;
    c.kv_element = element;
    for (float bad : {inf, nan}) {
      std::vector<float> keys(uint64_t{positions} * c.kv_size(), 0.1f), values(keys.size(), 1.0f);
      std::vector<float> q(uint64_t{rows} * c.q_size(), 0.2f);
      values[uint64_t{30} * c.kv_size() + 3] = bad;  // position 30, KV head 0, dimension 3
      // The last row's own position, KV head 1, dimension 9: only the last row sees it (as a zero
      // weight on it, 0 x inf, it would make NaN of the rows before).
      values[uint64_t{start + 2} * c.kv_size() + c.head_dim + 9] = bad;
      q[uint64_t{1} * c.q_size() + 5 * c.head_dim + 7] = bad;  // row 1's head 5 (of KV head 1)
      std::vector<float> out(q.size());
      const std::unique_ptr<KvCache> cache = CacheOf(c, keys, values);
      ASSERT_TRUE(DecodeAttention(c, 0, rows, start, *cache, q.data(), out.data(), 1).ok());
      for (uint32_t r = 0; r < rows; ++r) {
        for (uint32_t h = 0; h < c.num_attention_heads; ++h) {
          for (uint32_t d = 0; d < c.head_dim; ++d) {
            const float x = out[uint64_t{r} * c.q_size() + h * c.head_dim + d];
            const bool reads_value = (h < 4 && d == 3) || (r == 2 && h >= 4 && d == 9);
            const bool own_query = r == 1 && h == 5;
            if (reads_value || own_query) {
              EXPECT_FALSE(std::isfinite(x)) << ElementName(c) << " row " << r << " head " << h << " dimension " << d;
            } else {
              EXPECT_NEAR(x, 1.0f, 1e-5) << ElementName(c) << " row " << r << " head " << h << " dimension " << d;
            }
          }
        }
      }
    }
  }
}

// The softmax every attention row goes through (in AVX-512, and in the loops that run without
// it), against the definition in double precision, at lengths on and off its vector width:
// friendly scores, huge ones (whose differences overflow a naive exp), -inf (weighs exactly
// nothing); a NaN or +inf anywhere makes the whole row NaN, as the definition's arithmetic does
// (x - max is NaN for both).
TEST(Softmax, EqualsTheDefinitionAtEveryLengthWithHostileScores) {
  std::mt19937 generator(23);
  std::uniform_real_distribution<float> uniform(-30, 30);
  for (uint32_t n : {1u, 2u, 15u, 16u, 17u, 31u, 33u, 64u, 1000u, 2053u}) {
    for (int kind = 0; kind < 5; ++kind) {
      std::vector<float> x(n);
      for (float& v : x) v = uniform(generator);
      if (kind == 1) x[n / 2] = 1e30f, x[0] = -1e30f;
      if (kind == 2) x[n - 1] = -INFINITY;
      if (kind == 3) x[n / 3] = NAN;
      if (kind == 4) x[(n * 2) / 3] = INFINITY;
      std::vector<float> got = x, loops = x;
      Softmax(got.data(), n);
      SoftmaxLoops(loops.data(), n);
      double max = -INFINITY, total = 0;
      for (float v : x) max = std::max(max, double{v});
      std::vector<double> want(n);
      for (uint32_t j = 0; j < n; ++j) total += (want[j] = std::exp(double{x[j]} - max));
      for (uint32_t j = 0; j < n; ++j) {
        const std::string where = fmt::format("length {}, case {}, at {}", n, kind, j);
        const double p = want[j] / total;  // NaN for every case >= 3, and for a row of one -inf
        for (auto [name, value] : {std::pair{"Softmax", got[j]}, std::pair{"SoftmaxLoops", loops[j]}}) {
          if (std::isnan(p)) {
            ASSERT_TRUE(std::isnan(value)) << name << ", " << where << ": " << value;
            continue;
          }
          if (std::isinf(x[j])) {  // -inf beside finite scores
            ASSERT_EQ(value, 0.0f) << name << ", " << where;
            continue;
          }
          // x - max rounded to a float moves the exponent by up to half an ulp of the difference,
          // and a sum of n floats in f32 is within n half-ulps (the loops' sum may run in order).
          const double rounding = 1e-6 + std::fabs(double{x[j]} - max) * 6e-8 + n * 6e-8;
          ASSERT_NEAR(value, p, rounding * p + 1e-37) << name << ", " << where;
        }
      }
      if (kind >= 3) {
        ASSERT_TRUE(std::isnan(got[0]) && std::isnan(loops[0])) << "length " << n << ", case " << kind;
      }
    }
  }
}

}  // namespace
}  // namespace warmpool::transformer
