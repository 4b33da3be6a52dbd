#include "bench/generate.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "bench/stats.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/random_checkpoint.h"
#include "engines/transformer/weights.h"

namespace warmpool::bench {
namespace {

using Clock = std::chrono::steady_clock;
namespace tf = transformer;

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Bytes per second of reading `buffer` once, summed so the reads cannot be skipped, split over
// `threads` as the engine splits its rows. Sixteen independent sums: a single one would wait on
// each addition and measure the adder, not the memory.
double ReadBandwidth(const std::vector<float>& buffer, uint32_t threads) {
  constexpr int64_t kLanes = 16;
  const auto start = Clock::now();
  double total = 0;
  const int64_t blocks = static_cast<int64_t>(buffer.size()) / kLanes;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
  for (int64_t chunk = 0; chunk < blocks; chunk += 1024) {
    float lanes[kLanes] = {};
    const int64_t end = std::min(blocks, chunk + 1024);
    for (int64_t b = chunk; b < end; ++b) {
      const float* p = buffer.data() + b * kLanes;
      for (int64_t j = 0; j < kLanes; ++j) lanes[j] += p[j];
    }
    for (float lane : lanes) total += lane;
  }
  const double seconds = Seconds(start);
  if (total == 12345.678) std::puts("");  // keeps the sum alive
  return static_cast<double>(blocks * kLanes * sizeof(float)) / seconds;
}

}  // namespace

int RunGenerate(const GenerateOptions& options) {
  tf::RandomCheckpoint spec;
  spec.vocab_size = 32000;
  spec.hidden_size = 1024;
  spec.intermediate_size = 2816;
  spec.num_attention_heads = 16;
  spec.num_key_value_heads = 4;
  spec.max_position_embeddings = 4096;
  spec.dtype = options.dtype == "f32" ? safetensors::DType::F32
               : options.dtype == "f16" ? safetensors::DType::F16
                                        : safetensors::DType::BF16;
  if (options.dtype != "f32" && options.dtype != "f16" && options.dtype != "bf16") {
    std::fprintf(stderr, "error: --dtype %s: expected f32, f16 or bf16\n", options.dtype.c_str());
    return 1;
  }
  const uint64_t element = safetensors::DTypeSize(spec.dtype);
  const uint64_t hidden = spec.hidden_size, mlp = spec.intermediate_size, vocab = spec.vocab_size;
  const uint64_t kv = hidden / spec.num_attention_heads * spec.num_key_value_heads;
  const uint64_t per_layer = (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp + 2 * hidden) * element;
  const uint64_t outside = (2 * vocab * hidden + hidden) * element;
  const uint64_t wanted = uint64_t{options.model_mib} << 20;
  spec.num_hidden_layers = static_cast<uint32_t>(std::max<uint64_t>(1, wanted > outside ? (wanted - outside) / per_layer : 1));

  char pattern[] = "/tmp/warmpool-bench-generate-XXXXXX";
  if (mkdtemp(pattern) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = pattern;
  struct Cleanup {
    std::string dir;
    ~Cleanup() { std::filesystem::remove_all(dir); }
  } cleanup{dir};
  if (Status s = tf::WriteRandomCheckpoint(dir, spec); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    return 1;
  }
  Result<std::unique_ptr<tf::Checkpoint>> checkpoint = tf::Checkpoint::Open(dir);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "error: %s\n", checkpoint.status().ToString().c_str());
    return 1;
  }
  Result<tf::ModelWeights> weights = tf::BindWeights((*checkpoint)->config(), (*checkpoint)->tensors(), dir);
  if (!weights.ok()) {
    std::fprintf(stderr, "error: %s\n", weights.status().ToString().c_str());
    return 1;
  }
  tf::CpuModel model((*checkpoint)->config(), *weights, static_cast<int>(options.threads));
  // A decode step reads every weight but the embedding table (one row of it).
  const uint64_t step_bytes = weights->bytes - vocab * hidden * element;
  std::vector<float> buffer(std::max<uint64_t>(step_bytes, 64u << 20) / sizeof(float), 1.0f);

  std::vector<double> bandwidth, decode_tps, prefill_tps;
  for (uint32_t round = 0; round < options.rounds; ++round) {
    bandwidth.push_back(ReadBandwidth(buffer, options.threads));
    tf::KvCache cache((*checkpoint)->config(), options.prompt + options.tokens + 1);
    std::vector<int32_t> prompt(options.prompt);
    for (uint32_t i = 0; i < options.prompt; ++i) prompt[i] = static_cast<int32_t>((i * 7919u + round) % vocab);
    std::vector<float> logits(vocab);
    auto start = Clock::now();
    if (Status s = model.Forward(prompt, 0, cache, logits); !s.ok()) {
      std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
      return 1;
    }
    prefill_tps.push_back(options.prompt / Seconds(start));
    start = Clock::now();
    for (uint32_t t = 0; t < options.tokens; ++t) {
      const int32_t token = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (Status s = model.Forward({&token, 1}, options.prompt + t, cache, logits); !s.ok()) {
        std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    decode_tps.push_back(options.tokens / Seconds(start));
  }
  const double bw = Median(bandwidth), tps = Median(decode_tps), prefill = Median(prefill_tps);
  const double decode_bytes = tps * static_cast<double>(step_bytes);
  if (options.json) {
    std::printf("{\"layers\": %u, \"dtype\": \"%s\", \"weight_bytes\": %llu, \"threads\": %u, "
                "\"read_bandwidth_gbs\": %.3f, \"decode_tokens_per_s\": %.3f, \"decode_gbs\": %.3f, "
                "\"decode_fraction_of_bandwidth\": %.3f, \"prefill_tokens_per_s\": %.3f}\n",
                spec.num_hidden_layers, options.dtype.c_str(), static_cast<unsigned long long>(weights->bytes),
                options.threads, bw / 1e9, tps, decode_bytes / 1e9, decode_bytes / bw, prefill);
    return 0;
  }
  std::printf("transformer on the CPU: %u layers, %s weights, %.0f MiB, %u thread(s), median of %u rounds\n",
              spec.num_hidden_layers, options.dtype.c_str(), weights->bytes / 1048576.0, options.threads,
              options.rounds);
  std::printf("  read bandwidth (sum of a %.0f MiB buffer)   %8.2f GB/s\n", buffer.size() * 4 / 1048576.0, bw / 1e9);
  std::printf("  decode, batch 1                         %8.2f tokens/s  %6.2f GB/s of weights  %.2fx the bandwidth\n",
              tps, decode_bytes / 1e9, decode_bytes / bw);
  std::printf("  prefill of %u tokens                    %8.2f tokens/s\n", options.prompt, prefill);
  return 0;
}

}  // namespace warmpool::bench
