#include "bench/generate.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench/stats.h"
#include "common/paths.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/prefill_matmul.h"
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

// The prefill's products alone on oneDNN (the engine's PrefillMatmul on the weights as stored, as
// the forward pass calls it: bf16 products where the CPU has them, f16 widened per call): every
// projection of every layer and the output head's one row, for `rows` prompt tokens. Seconds.
class ProductsAlone {
 public:
  ProductsAlone(const tf::ModelWeights& w, int threads) : threads_(threads) {
    for (const tf::LayerWeights& layer : w.layers) {
      for (const tf::Matrix* m : {&layer.q, &layer.k, &layer.v, &layer.o, &layer.gate, &layer.up, &layer.down}) Add(*m);
    }
    Add(w.lm_head);
  }
  double Seconds(uint32_t rows) {
    std::vector<float> x(uint64_t{rows} * widest_, 0.5f), y(uint64_t{rows} * tallest_);
    const auto start = Clock::now();
    for (size_t i = 0; i < matrices_.size(); ++i) {
      const bool head = i + 1 == matrices_.size();  // the output head: the last row only
      if (!matmul_.Run(x.data(), head ? 1 : rows, matrices_[i], {}, y.data(), threads_).ok()) return -1;
    }
    return bench::Seconds(start);
  }

 private:
  void Add(const tf::Matrix& m) {
    matrices_.push_back(m);
    widest_ = std::max(widest_, m.cols);
    tallest_ = std::max(tallest_, m.rows);
  }
  int threads_;
  std::vector<tf::Matrix> matrices_;
  uint32_t widest_ = 0, tallest_ = 0;
  tf::PrefillMatmul matmul_;
};

struct TorchFigures {
  double decode = 0, prefill = 0;
  std::string why_not;  // set when there are none
};

// PyTorch on the same checkpoint (bench/torch_llama.py): the medians of its rounds.
TorchFigures RunTorch(const GenerateOptions& options, const std::string& dir) {
  TorchFigures out;
  if (options.torch_python.empty()) return out.why_not = "not asked for (--torch-python \"\")", out;
  const std::string command =
      fmt::format("{} {} {} {} {} {} {} {} 2>&1", options.torch_python, NextToSelf("warmpool-bench-torch-llama.py"), dir,
                  options.dtype, options.threads, options.prompt, options.tokens, options.rounds);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out.why_not = "cannot run " + options.torch_python, out;
  std::string text;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) text.append(buf, n);
  const int status = pclose(pipe);
  try {
    const nlohmann::json figures = nlohmann::json::parse(text.substr(text.rfind('{')));
    out.decode = Median(figures.at("decode_tokens_per_s").get<std::vector<double>>());
    out.prefill = Median(figures.at("prefill_tokens_per_s").get<std::vector<double>>());
  } catch (const std::exception&) {
    while (!text.empty() && text.back() == '\n') text.pop_back();
    out.why_not = fmt::format("PyTorch gave no figures (status {}): {}", status, text.substr(0, 300));
  }
  return out;
}

// --batch sequences, each prefilled with a --prompt of its own (as long as batch 1's: their
// attention reads as many positions), then --tokens steps of all of them together (a decode token
// each): their aggregate tokens/s.
Result<double> BatchedDecode(tf::CpuModel& model, const tf::Config& config, const GenerateOptions& options,
                             uint32_t round) {
  const uint32_t prompt_tokens = options.prompt;
  std::vector<std::unique_ptr<tf::KvCache>> caches;
  std::vector<tf::StepRun> runs;
  std::vector<int32_t> tokens;
  std::vector<float> logits(uint64_t{options.batch} * config.vocab_size);
  for (uint32_t b = 0; b < options.batch; ++b) {
    caches.push_back(std::make_unique<tf::KvCache>(config, prompt_tokens + options.tokens + 1));
    std::vector<int32_t> prompt(prompt_tokens);
    for (uint32_t i = 0; i < prompt_tokens; ++i) {
      prompt[i] = static_cast<int32_t>((i * 7919u + b * 131u + round) % config.vocab_size);
    }
    if (Status s = model.Forward(prompt, 0, *caches.back(), std::span<float>(logits).first(config.vocab_size)); !s.ok()) {
      return s;
    }
    runs.push_back({caches.back().get(), prompt_tokens, 1});
    tokens.push_back(prompt.back());
  }
  const auto start = Clock::now();
  for (uint32_t t = 0; t < options.tokens; ++t) {
    if (Status s = model.Step(tokens, runs, logits); !s.ok()) return s;
    for (uint32_t b = 0; b < options.batch; ++b) {
      const auto row = std::span<const float>(logits).subspan(uint64_t{b} * config.vocab_size, config.vocab_size);
      tokens[b] = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      runs[b].start++;
    }
  }
  return static_cast<double>(options.batch) * options.tokens / Seconds(start);
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
  // The KV cache's element as the engine chooses it on this CPU (bf16 for bf16 weights, where it can),
  // unless --kv-cache says.
  tf::Config config = (*checkpoint)->config();
  config.kv_element = options.kv_cache == "bf16"  ? tf::KvElement::kBF16
                      : options.kv_cache == "f32" ? tf::KvElement::kF32
                                                  : tf::ChooseKvElement(spec.dtype, config.head_dim, /*on_device=*/false);
  if (config.kv_element == tf::KvElement::kBF16 && !tf::HaveBF16KvCache(config.head_dim)) {
    std::fprintf(stderr, "error: --kv-cache bf16: this CPU cannot keep one (AVX-512 BF16)\n");
    return 1;
  }
  tf::CpuModel model(config, *weights, static_cast<int>(options.threads));
  // A decode step reads every weight but the embedding table (one row of it).
  const uint64_t step_bytes = weights->bytes - vocab * hidden * element;
  std::vector<float> buffer(std::max<uint64_t>(step_bytes, 64u << 20) / sizeof(float), 1.0f);

  ProductsAlone products(*weights, static_cast<int>(options.threads));
  std::vector<double> bandwidth, decode_tps, prefill_tps, products_tps, batch_tps;
  for (uint32_t round = 0; round < options.rounds; ++round) {
    bandwidth.push_back(ReadBandwidth(buffer, options.threads));
    products_tps.push_back(options.prompt / products.Seconds(options.prompt));
    tf::KvCache cache(config, options.prompt + options.tokens + 1);
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
    if (options.batch > 1) {
      Result<double> batched = BatchedDecode(model, config, options, round);
      if (!batched.ok()) {
        std::fprintf(stderr, "error: %s\n", batched.status().ToString().c_str());
        return 1;
      }
      batch_tps.push_back(*batched);
    }
  }
  const double batched = options.batch > 1 ? Median(batch_tps) : 0;
  const double bw = Median(bandwidth), tps = Median(decode_tps), prefill = Median(prefill_tps);
  const double alone = Median(products_tps);
  const double decode_bytes = tps * static_cast<double>(step_bytes);
  const TorchFigures torch = RunTorch(options, dir);
  if (options.json) {
    nlohmann::json out = {{"layers", spec.num_hidden_layers},
                          {"dtype", options.dtype},
                          {"kv_cache", config.kv_element == tf::KvElement::kBF16 ? "bf16" : "f32"},
                          {"weight_bytes", weights->bytes}, {"threads", options.threads},
                          {"read_bandwidth_gbs", bw / 1e9}, {"decode_tokens_per_s", tps},
                          {"decode_gbs", decode_bytes / 1e9}, {"decode_fraction_of_bandwidth", decode_bytes / bw},
                          {"prefill_tokens_per_s", prefill}, {"prefill_products_alone_tokens_per_s", alone},
                          {"prefill_vs_products_alone", prefill / alone}};
    if (options.batch > 1) {
      out["batch"] = options.batch;
      out["batch_decode_tokens_per_s"] = batched;
      out["batch_vs_batch_1"] = batched / tps;
    }
    if (torch.why_not.empty()) {
      out["torch_decode_tokens_per_s"] = torch.decode;
      out["torch_prefill_tokens_per_s"] = torch.prefill;
      out["decode_vs_torch"] = tps / torch.decode;
      out["prefill_vs_torch"] = prefill / torch.prefill;
    } else {
      out["torch"] = torch.why_not;
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("transformer on the CPU: %u layers, %s weights, %.0f MiB, a %s KV cache, %u thread(s), median of %u "
              "rounds\n",
              spec.num_hidden_layers, options.dtype.c_str(), weights->bytes / 1048576.0,
              config.kv_element == tf::KvElement::kBF16 ? "bf16" : "f32", options.threads, options.rounds);
  std::printf("  read bandwidth (sum of a %.0f MiB buffer)   %8.2f GB/s\n", buffer.size() * 4 / 1048576.0, bw / 1e9);
  std::printf("  decode, batch 1                         %8.2f tokens/s  %6.2f GB/s of weights  %.2fx the bandwidth\n",
              tps, decode_bytes / 1e9, decode_bytes / bw);
  if (options.batch > 1) {
    std::printf("  decode, %2u sequences stepped together     %8.2f tokens/s  %.2fx batch 1\n", options.batch, batched,
                batched / tps);
  }
  std::printf("  prefill of %u tokens                    %8.2f tokens/s\n", options.prompt, prefill);
  std::printf("  its products alone on oneDNN            %8.2f tokens/s  prefill %.2fx that\n", alone, prefill / alone);
  if (!torch.why_not.empty()) {
    std::printf("  PyTorch: none (%s)\n", torch.why_not.c_str());
    return 0;
  }
  std::printf("  PyTorch, %s, decode                   %8.2f tokens/s  engine %.2fx\n", options.dtype.c_str(),
              torch.decode, tps / torch.decode);
  std::printf("  PyTorch, %s, prefill                  %8.2f tokens/s  engine %.2fx\n", options.dtype.c_str(),
              torch.prefill, prefill / torch.prefill);
  return 0;
}

}  // namespace warmpool::bench
