#include "bench/decode_attention.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "bench/stats.h"
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

// Every float of the sequences' keys and values of every layer, summed in order (vectors of 16, four
// sums at once): the bytes attention must read, at the pace reading alone goes.
__attribute__((target("avx512f"))) float ReadEverything(const tf::Config& c,
                                                         std::vector<std::unique_ptr<tf::KvCache>>& caches,
                                                         uint32_t positions) {
  __m512 sums[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    for (auto& cache : caches) {
      for (uint32_t p = 0; p < positions;) {
        const uint32_t span = tf::KvCache::Contiguous(p, positions);
        for (const float* run : {cache->key(l, p), cache->value(l, p)}) {
          const uint64_t floats = uint64_t{span} * c.kv_size();
          for (uint64_t i = 0; i + 64 <= floats; i += 64) {
            for (uint32_t j = 0; j < 4; ++j) sums[j] = _mm512_add_ps(sums[j], _mm512_loadu_ps(run + i + 16 * j));
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

}  // namespace

int RunDecodeAttention(const DecodeAttentionOptions& options) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "warmpool-bench --attention: this CPU has no AVX-512F, so decode attention runs on oneDNN\n");
    return 1;
  }
  tf::Config c;
  c.num_hidden_layers = 11;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.hidden_size = 1024;
  const uint32_t positions = std::max(1u, options.positions);
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> uniform(-1, 1);
  std::vector<std::unique_ptr<tf::KvCache>> caches;
  for (uint32_t s = 0; s < std::max(1u, options.sequences); ++s) {
    caches.push_back(std::make_unique<tf::KvCache>(c, positions));
    tf::KvCache& cache = *caches.back();
    if (Status st = cache.Prepare(0, positions); !st.ok()) {
      std::fprintf(stderr, "warmpool-bench --attention: %s\n", st.ToString().c_str());
      return 1;
    }
    for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
      for (uint32_t p = 0; p < positions; ++p) {
        std::generate_n(cache.key(l, p), c.kv_size(), [&] { return uniform(generator); });
        std::generate_n(cache.value(l, p), c.kv_size(), [&] { return uniform(generator); });
      }
    }
    cache.Commit(0, std::vector<int32_t>(positions, 0));
  }
  std::vector<float> q(c.q_size()), out(caches.size() * c.q_size());
  std::generate(q.begin(), q.end(), [&] { return uniform(generator); });
  const auto threads = static_cast<int>(options.threads);
  std::vector<tf::DecodeRows> rows;
  for (size_t s = 0; s < caches.size(); ++s) {
    rows.push_back({1, positions - 1, caches[s].get(), q.data(), &out[s * c.q_size()]});
  }
  auto step = [&]() -> bool {  // one decode step's attention: every layer, all the sequences in one call, as a step
    for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
      if (!tf::DecodeAttention(c, l, rows, threads).ok()) return false;
    }
    return true;
  };
  const uint64_t calls = uint64_t{c.num_hidden_layers} * caches.size();
  std::vector<double> attention, reading, cached;
  float sink = 0;
  const std::vector<float> weights((uint64_t{256} << 20) / sizeof(float), 1.0f);
  for (uint32_t r = 0; r <= options.rounds; ++r) {  // round 0 warms up
    sink += Evict(weights);
    Clock::time_point start = Clock::now();
    if (!step()) {
      std::fprintf(stderr, "warmpool-bench --attention: oneDNN refused a product\n");
      return 1;
    }
    const double attention_ms = MillisecondsSince(start);
    sink += Evict(weights);
    start = Clock::now();
    sink += ReadEverything(c, caches, positions);
    const double reading_ms = MillisecondsSince(start);
    start = Clock::now();
    for (uint64_t i = 0; i < calls; ++i) {
      (void)tf::DecodeAttention(c, 0, 1, positions - 1, *caches[0], q.data(), out.data(), threads);
    }
    const double cached_ms = MillisecondsSince(start);
    if (r == 0) continue;
    attention.push_back(attention_ms);
    reading.push_back(reading_ms);
    cached.push_back(cached_ms);
  }
  g_sink = sink;
  const double a = Median(attention), b = Median(reading), k = Median(cached);
  const double bytes = 2.0 * calls * positions * c.kv_size() * sizeof(float);
  if (options.json) {
    std::printf("{\"mode\": \"decode-attention\", \"sequences\": %zu, \"positions\": %u, \"threads\": %u, "
                "\"attention_ms\": %.4f, \"reading_ms\": %.4f, \"in_cache_ms\": %.4f, \"kv_bytes\": %.0f}\n",
                caches.size(), positions, options.threads, a, b, k, bytes);
    return 0;
  }
  std::printf("decode attention: %zu sequences x %u layers, one row each over %u positions (%.1f MiB of keys and "
              "values), %u thread(s), medians of %u rounds\n",
              caches.size(), c.num_hidden_layers, positions, bytes / 1048576.0, options.threads, options.rounds);
  std::printf("  from memory      %8.3f ms   reading its keys and values alone %8.3f ms (%.1f GB/s): %.2fx that\n",
              a, b, bytes / b / 1e6, a / b);
  std::printf("  in the cache     %8.3f ms   (one sequence's first layer, %" PRIu64 " calls)\n", k, calls);
  return 0;
}

}  // namespace warmpool::bench
