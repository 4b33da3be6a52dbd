#include "bench/piece_cost.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/in_process_model.h"
#include "bench/stats.h"
#include "engines/transformer/cpu_model.h"

namespace warmpool::bench {
namespace {

namespace tf = transformer;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kPieces[] = {1, 2, 4, 8, 16, 32, 64};
constexpr uint32_t kStreamPosition = 200;  // the decoding stream's row

// Fills `cache` from position 0 to `end` in 256-token passes (not timed).
Status Fill(tf::CpuModel& model, tf::KvCache& cache, uint32_t end, std::vector<float>& logits) {
  for (uint32_t p = 0; p < end;) {
    const uint32_t n = std::min(256u, end - p);
    std::vector<int32_t> tokens(n);
    for (uint32_t i = 0; i < n; ++i) tokens[i] = static_cast<int32_t>((p + i) * 7919u % 32000);
    const tf::StepRun run{&cache, p, n, false};
    if (Status s = model.Step(tokens, {&run, 1}, std::span<float>(logits).first(model.config().vocab_size)); !s.ok()) {
      return s;
    }
    p += n;
  }
  return OkStatus();
}

}  // namespace

int RunPieceCost(const PieceCostOptions& options) {
  InProcessModel model;
  if (Status s = OpenInProcessModel(options.model_mib, std::max(options.position, kStreamPosition) + 256, options.threads,
                                    model);
      !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  const tf::Config& c = model.config;
  const uint32_t context = std::max(options.position, kStreamPosition) + 128;
  tf::KvCache stream(c, context), prompt(c, context);
  std::vector<float> logits(2ull * c.vocab_size);
  if (Status s = Fill(*model.cpu, stream, kStreamPosition, logits); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  // One step: the stream's decode row, and `piece` prompt tokens at `at` (none: the decode alone).
  auto step = [&](uint32_t at, uint32_t piece) -> Result<double> {
    std::vector<int32_t> tokens{5};
    for (uint32_t i = 0; i < piece; ++i) tokens.push_back(static_cast<int32_t>((at + i) * 31u % c.vocab_size));
    std::vector<tf::StepRun> runs{{&stream, kStreamPosition, 1, true}};
    if (piece > 0) runs.push_back({&prompt, at, piece, false});
    const auto start = Clock::now();
    if (Status s = model.cpu->Step(tokens, runs, std::span<float>(logits).first(runs.size() * c.vocab_size)); !s.ok()) {
      return s;
    }
    return MsSince(start);
  };
  const uint32_t positions[] = {0, options.position};
  std::vector<double> decode;
  std::vector<std::vector<double>> times(std::size(positions) * std::size(kPieces));
  for (size_t p = 0; p < std::size(positions); ++p) {
    if (Status s = Fill(*model.cpu, prompt, positions[p], logits); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 1;
    }
    // Untimed: the first products of a shape in a process make oneDNN's and the kernels' code hot.
    for (uint32_t piece : {0u, kPieces[std::size(kPieces) - 1]}) {
      if (Result<double> ms = step(positions[p], piece); !ms.ok()) {
        return std::fprintf(stderr, "error: %s\n", ms.status().ToString().c_str()), 1;
      }
    }
    for (uint32_t round = 0; round < options.rounds; ++round) {
      Result<double> alone = step(0, 0);
      if (!alone.ok()) return std::fprintf(stderr, "error: %s\n", alone.status().ToString().c_str()), 1;
      decode.push_back(*alone);
      for (size_t k = 0; k < std::size(kPieces); ++k) {
        Result<double> ms = step(positions[p], kPieces[k]);
        if (!ms.ok()) return std::fprintf(stderr, "error: %s\n", ms.status().ToString().c_str()), 1;
        times[p * std::size(kPieces) + k].push_back(*ms);
      }
    }
  }
  const double alone = Median(decode);
  nlohmann::json pieces = nlohmann::json::array();
  if (!options.json) {
    std::printf("warmpool-bench --generate --pieces: a %u MiB bf16 model (%u layers), a %s KV cache, %u thread(s), "
                "medians of %u rounds\n",
                options.model_mib, c.num_hidden_layers, c.kv_element == tf::KvElement::kBF16 ? "bf16" : "f32",
                options.threads, options.rounds);
    std::printf("  a decode step alone (one stream at position %u): %.2f ms\n", kStreamPosition, alone);
    std::printf("  with a prompt's piece in the same step:\n");
    std::printf("  %8s %6s %9s %9s %9s\n", "position", "piece", "step ms", "x decode", "ms/token");
  }
  for (size_t p = 0; p < std::size(positions); ++p) {
    for (size_t k = 0; k < std::size(kPieces); ++k) {
      const double ms = Median(times[p * std::size(kPieces) + k]);
      const double per_token = (ms - alone) / kPieces[k];
      pieces.push_back({{"position", positions[p]}, {"tokens", kPieces[k]}, {"step_ms", ms},
                        {"vs_decode", ms / alone}, {"ms_per_token", per_token}});
      if (!options.json) {
        std::printf("  %8u %6u %9.2f %8.2fx %9.3f\n", positions[p], kPieces[k], ms, ms / alone, per_token);
      }
    }
  }
  if (options.json) {
    const nlohmann::json out = {{"layers", c.num_hidden_layers}, {"threads", options.threads},
                                {"decode_ms", alone}, {"pieces", pieces}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}

}  // namespace warmpool::bench
