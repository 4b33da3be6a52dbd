#include "bench/embed_cost.h"

#include <chrono>
#include <cstdio>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/in_process_model.h"
#include "bench/stats.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/embedding.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/kv_cache.h"

namespace warmpool::bench {
namespace {

namespace tf = transformer;
using Clock = std::chrono::steady_clock;

int Fail(const Status& s) {
  std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
  return 1;
}

}  // namespace

int RunEmbedCost(const EmbedCostOptions& options) {
  if (options.inputs == 0 || options.tokens == 0 || options.tokens > tf::kPrefillPiece) {
    return Fail(Error(Code::kInvalidArgument, "--batch inputs of --tokens 1 to {} tokens each", tf::kPrefillPiece));
  }
  InProcessModel model;
  const uint32_t context = 512;
  if (Status s = OpenInProcessModel(options.model_mib, context, options.threads, model); !s.ok()) return Fail(s);
  const tf::Config& c = model.config;
  // The engine's pool for 4 sequences of the context (its default), as Embed finds it.
  Result<std::unique_ptr<tf::KvPool>> pool = tf::KvPool::Make(c, tf::KvPoolBlocks(context, 4));
  if (!pool.ok()) return Fail(pool.status());
  tf::KvCache cache(**pool, context);
  tf::CpuSequence sequence(*model.cpu, cache);
  std::vector<std::vector<int32_t>> inputs(options.inputs);
  for (uint32_t i = 0; i < options.inputs; ++i) {
    for (uint32_t t = 0; t < options.tokens; ++t) inputs[i].push_back(static_cast<int32_t>((i * 131 + t * 7919) % 32000));
  }
  std::vector<float> out(uint64_t{options.inputs} * c.hidden_size);
  auto alone = [&]() -> Result<double> {
    const auto start = Clock::now();
    for (uint32_t i = 0; i < options.inputs; ++i) {
      std::span<float> row(out.data() + uint64_t{i} * c.hidden_size, c.hidden_size);
      if (Status s = tf::EmbedTokens(sequence, inputs[i], row); !s.ok()) return s;
    }
    return MsSince(start);
  };
  size_t groups = 0;
  auto grouped = [&]() -> Result<double> {
    const auto start = Clock::now();
    groups = 0;
    for (size_t i = 0; i < inputs.size();) {
      const size_t end = tf::EmbedGroupEnd(inputs, i, tf::AvailableBlocks(**pool));
      std::span<float> rows(out.data() + i * c.hidden_size, (end - i) * c.hidden_size);
      if (Status s = tf::EmbedGroup(*model.cpu, **pool, context, std::span(inputs).subspan(i, end - i), rows); !s.ok()) {
        return s;
      }
      i = end;
      ++groups;
    }
    return MsSince(start);
  };
  // Untimed: the first products of each shape make oneDNN's and the kernels' code hot.
  if (Result<double> ms = alone(); !ms.ok()) return Fail(ms.status());
  if (Result<double> ms = grouped(); !ms.ok()) return Fail(ms.status());
  std::vector<double> alone_ms, grouped_ms;
  for (uint32_t round = 0; round < options.rounds; ++round) {
    Result<double> a = alone();
    if (!a.ok()) return Fail(a.status());
    Result<double> g = grouped();
    if (!g.ok()) return Fail(g.status());
    alone_ms.push_back(*a);
    grouped_ms.push_back(*g);
  }
  const double a = Median(alone_ms), g = Median(grouped_ms);
  const double alone_rate = options.inputs * 1000.0 / a, grouped_rate = options.inputs * 1000.0 / g;
  if (options.json) {
    const nlohmann::json doc = {{"layers", c.num_hidden_layers}, {"inputs", options.inputs}, {"tokens", options.tokens},
                                {"groups", groups}, {"alone_ms", a}, {"grouped_ms", g},
                                {"alone_inputs_per_s", alone_rate}, {"grouped_inputs_per_s", grouped_rate},
                                {"speedup", a / g}};
    std::printf("%s\n", doc.dump().c_str());
    return 0;
  }
  std::printf("warmpool-bench --generate --embeddings: a %u MiB bf16 model (%u layers), %u inputs of %u tokens, %u "
              "thread(s), medians of %u rounds\n",
              options.model_mib, c.num_hidden_layers, options.inputs, options.tokens, options.threads, options.rounds);
  std::printf("  one at a time: %9.1f ms  %8.1f inputs/s\n", a, alone_rate);
  std::printf("  in %zu group(s): %7.1f ms  %8.1f inputs/s  (%.2fx)\n", groups, g, grouped_rate, a / g);
  return 0;
}

}  // namespace warmpool::bench
