#include "bench/decode_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/stats.h"
#include "engines/bf16_gemv.h"
#include "engines/transformer/config.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/kv_cache.h"

// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps) pass `_mm256_undefined_*()`, a
// self-initialised variable, as an unused merge operand (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace warmpool::bench {
namespace {

// Where the sums go, so that the reads are not optimised away.
volatile float g_sink = 0;

namespace tf = transformer;
using Clock = std::chrono::steady_clock;

double MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Every byte of the sequences' keys and values of every layer, summed in order as floats (vectors
// of 16, four sums at once; bf16 pairs read as one float, the sum meaningless): the bytes
// attention must read, at the pace reading alone goes.
__attribute__((target("avx512f"))) float ReadEverything(const tf::Config& c,
                                                         std::vector<std::unique_ptr<tf::KvCache>>& caches,
                                                         uint32_t positions) {
  __m512 sums[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const bool bf16 = c.kv_element == tf::KvElement::kBF16;
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    for (auto& cache : caches) {
      for (uint32_t p = 0; p < positions;) {
        const uint32_t span = tf::KvCache::Contiguous(p, positions);
        const void* key = bf16 ? static_cast<const void*>(cache->key_bf16(l, p)) : cache->key(l, p);
        const void* value = bf16 ? static_cast<const void*>(cache->value_bf16(l, p)) : cache->value(l, p);
        for (const void* run : {key, value}) {
          const auto* floats_at = static_cast<const float*>(run);
          const uint64_t floats = uint64_t{span} * c.kv_size() * tf::KvElementBytes(c.kv_element) / sizeof(float);
          for (uint64_t i = 0; i + 64 <= floats; i += 64) {
            for (uint32_t j = 0; j < 4; ++j) sums[j] = _mm512_add_ps(sums[j], _mm512_loadu_ps(floats_at + i + 16 * j));
          }
        }
        p += span;
      }
    }
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(sums[0], sums[1]), _mm512_add_ps(sums[2], sums[3])));
}

// A sum over a buffer of a 256 MiB model's weights: what a decode step reads between one layer's
// attention and the next step's, which leaves the keys and values in memory, not in a cache.
__attribute__((target("avx512f"))) float Evict(const std::vector<float>& weights) {
  __m512 sum = _mm512_setzero_ps();
  for (uint64_t i = 0; i + 16 <= weights.size(); i += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(&weights[i]));
  return _mm512_reduce_add_ps(sum);
}

// The model's attention shape, its caches of `element` filled with the same random keys and values
// (bf16: rounded), and the medians of what each round measured.
struct Setup {
  tf::Config c;
  std::vector<std::unique_ptr<tf::KvCache>> caches;
  std::vector<float> q, out;
  std::vector<tf::DecodeRows> rows;
  std::vector<double> attention, reading, cached;

  Status Fill(tf::KvElement element, const DecodeAttentionOptions& options) {
    c.num_hidden_layers = 11;
    c.num_attention_heads = 16;
    c.num_key_value_heads = 4;
    c.head_dim = 64;
    c.hidden_size = 1024;
    c.kv_element = element;
    const uint32_t positions = std::max(1u, options.positions);
    std::mt19937 generator(7);
    std::uniform_real_distribution<float> uniform(-1, 1);
    std::vector<float> row(c.kv_size());
    for (uint32_t s = 0; s < std::max(1u, options.sequences); ++s) {
      caches.push_back(std::make_unique<tf::KvCache>(c, positions));
      tf::KvCache& cache = *caches.back();
      if (Status st = cache.Prepare(0, positions); !st.ok()) return st;
      for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
        for (uint32_t p = 0; p < positions; ++p) {
          for (int half = 0; half < 2; ++half) {
            std::generate(row.begin(), row.end(), [&] { return uniform(generator); });
            if (element == tf::KvElement::kBF16) {
              dense::NarrowToBF16(row.data(), row.size(), half == 0 ? cache.key_bf16(l, p) : cache.value_bf16(l, p));
            } else {
              std::copy(row.begin(), row.end(), half == 0 ? cache.key(l, p) : cache.value(l, p));
            }
          }
        }
      }
      cache.Commit(0, std::vector<int32_t>(positions, 0));
    }
    q.resize(c.q_size());
    out.resize(caches.size() * c.q_size());
    std::generate(q.begin(), q.end(), [&] { return uniform(generator); });
    for (size_t s = 0; s < caches.size(); ++s) {
      rows.push_back({1, positions - 1, caches[s].get(), q.data(), &out[s * c.q_size()]});
    }
    return OkStatus();
  }

  // One round: a step's attention from memory, reading alone, and one sequence's first layer as
  // often from the cache. False: a product was refused.
  bool Round(uint32_t positions, int threads, const std::vector<float>& weights, bool keep, float& sink) {
    sink += Evict(weights);
    Clock::time_point start = Clock::now();
    for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {  // every layer, all the sequences in one call, as a step
      if (!tf::DecodeAttention(c, l, rows, threads).ok()) return false;
    }
    const double attention_ms = MillisecondsSince(start);
    sink += Evict(weights);
    start = Clock::now();
    sink += ReadEverything(c, caches, positions);
    const double reading_ms = MillisecondsSince(start);
    start = Clock::now();
    for (uint64_t i = 0; i < Calls(); ++i) {
      (void)tf::DecodeAttention(c, 0, 1, positions - 1, *caches[0], q.data(), out.data(), threads);
    }
    const double cached_ms = MillisecondsSince(start);
    if (keep) {
      attention.push_back(attention_ms);
      reading.push_back(reading_ms);
      cached.push_back(cached_ms);
    }
    return true;
  }
  uint64_t Calls() const { return uint64_t{c.num_hidden_layers} * caches.size(); }
  double Bytes(uint32_t positions) const {
    return 2.0 * Calls() * positions * c.kv_size() * tf::KvElementBytes(c.kv_element);
  }
};

}  // namespace

int RunDecodeAttention(const DecodeAttentionOptions& options) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "warmpool-bench --attention: this CPU has no AVX-512F, so decode attention runs on oneDNN\n");
    return 1;
  }
  const uint32_t positions = std::max(1u, options.positions);
  // f32 caches, and bf16 ones where this CPU keeps them (a bf16 model's), in alternate rounds.
  std::vector<std::pair<const char*, Setup>> setups;
  setups.emplace_back("f32", Setup{});
  if (tf::HaveBF16KvCache(64)) setups.emplace_back("bf16", Setup{});
  for (auto& [name, setup] : setups) {
    const tf::KvElement element = std::string_view(name) == "bf16" ? tf::KvElement::kBF16 : tf::KvElement::kF32;
    if (Status st = setup.Fill(element, options); !st.ok()) {
      std::fprintf(stderr, "warmpool-bench --attention: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  const auto threads = static_cast<int>(options.threads);
  float sink = 0;
  const std::vector<float> weights((uint64_t{256} << 20) / sizeof(float), 1.0f);
  for (uint32_t r = 0; r <= options.rounds; ++r) {  // round 0 warms up
    for (size_t i = 0; i < setups.size(); ++i) {
      Setup& setup = setups[r % 2 == 0 ? i : setups.size() - 1 - i].second;  // ABBA
      if (!setup.Round(positions, threads, weights, r != 0, sink)) {
        std::fprintf(stderr, "warmpool-bench --attention: oneDNN refused a product\n");
        return 1;
      }
    }
  }
  g_sink = sink;
  const Setup& first = setups.front().second;
  if (options.json) {  // one object: the shape, then each element's figures under its name
    std::printf("{\"mode\": \"decode-attention\", \"sequences\": %zu, \"positions\": %u, \"threads\": %u",
                first.caches.size(), positions, options.threads);
    for (const auto& [name, setup] : setups) {
      std::printf(", \"%s\": {\"attention_ms\": %.4f, \"reading_ms\": %.4f, \"in_cache_ms\": %.4f, \"kv_bytes\": %.0f}",
                  name, Median(setup.attention), Median(setup.reading), Median(setup.cached), setup.Bytes(positions));
    }
    std::printf("}\n");
    return 0;
  }
  std::printf("decode attention: %zu sequences x %u layers, one row each over %u positions, %u thread(s), medians "
              "of %u rounds\n",
              first.caches.size(), first.c.num_hidden_layers, positions, options.threads, options.rounds);
  for (const auto& [name, setup] : setups) {
    const double a = Median(setup.attention), b = Median(setup.reading), k = Median(setup.cached);
    const double bytes = setup.Bytes(positions);
    std::printf("  %-4s keys and values (%.1f MiB)\n", name, bytes / 1048576.0);
    std::printf("    from memory    %8.3f ms   reading them alone %8.3f ms (%.1f GB/s): %.2fx that\n", a, b,
                bytes / b / 1e6, a / b);
    std::printf("    in the cache   %8.3f ms   (one sequence's first layer, %" PRIu64 " calls)\n", k, setup.Calls());
  }
  if (setups.size() == 2) {
    std::printf("  bf16 against f32: %.2fx the time from memory, %.2fx in the cache\n",
                Median(setups[1].second.attention) / Median(setups[0].second.attention),
                Median(setups[1].second.cached) / Median(setups[0].second.cached));
  }
  return 0;
}

}  // namespace warmpool::bench
