// warmpool-transformer-probe: the transformer engine's answers on one model directory, as JSON, for
// scripts/gpu-check.sh to hold against Hugging Face `transformers` and `tokenizers` on the GPU
// machine (tests/gpu/compare_with_transformers.py), and its decode speed against the device's
// memory bandwidth measured in the same run.
//
//   warmpool-transformer-probe logits DIR --tokens 1,2,3 [--device cpu|gpu] [--greedy N]
//     The last token's logits after the tokens, and N greedy tokens from there (a checkpoint: no
//     tokenizer needed).
//   warmpool-transformer-probe encode DIR --texts FILE
//     Each line of FILE (a JSON string) tokenized, with and without the tokenizer's special tokens.
//   warmpool-transformer-probe decode-speed DIR [--tokens N]
//     Decode tokens/s on the GPU at batch 1, the weight bytes each token reads (all but the rows of
//     an untied embedding table it does not look up), and a device-to-device copy's bandwidth
//     (2 x bytes / time: it reads and writes each byte), in one run; and 8 streams decoding in the
//     same steps (continuous batching), their tokens/s together against one stream's.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/command_line.h"
#include "devmem/host_memory.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/cpu_model.h"
#include "engines/transformer/generation.h"
#include "engines/transformer/gpu_slots.h"
#include "engines/transformer/model_directory.h"
#include "tests/gpu/in_process_memory.h"

namespace warmpool {
namespace {

using Json = nlohmann::json;
namespace tf = transformer;

int Fail(const Status& s) {
  std::printf("%s\n", Json{{"error", s.ToString()}}.dump().c_str());
  return 1;
}

// The model on the device: its tensors copied into one region of device memory, bound there.
struct OnGpu {
  std::unique_ptr<InProcessCudaMemory> memory;
  wp_region region{nullptr, 0, -1};
  std::unique_ptr<tf::Sequence> sequence;
  tf::ModelWeights weights;  // device pointers into the region
  uint64_t weight_bytes = 0;
  ~OnGpu() {
    sequence.reset();
    if (region.ptr != nullptr) memory->service()->free(memory->service()->ctx, &region);
  }
};

Status StartOnGpu(const tf::Checkpoint& checkpoint, uint32_t context, OnGpu& gpu) {
  Result<std::unique_ptr<InProcessCudaMemory>> memory = InProcessCudaMemory::Open(0);
  if (!memory.ok()) return memory.status();
  gpu.memory = std::move(*memory);
  const wp_device_memory* service = gpu.memory->service();
  uint64_t bytes = 0;
  for (const auto& [name, t] : checkpoint.tensors()) bytes += (t.bytes + 255) / 256 * 256;
  if (service->alloc(service->ctx, bytes, &gpu.region) != WP_OK) {
    return Error(Code::kResourceExhausted, "cannot allocate {} bytes on the device", bytes);
  }
  std::map<std::string, tf::TensorView> views;
  uint64_t at = 0;
  for (const auto& [name, t] : checkpoint.tensors()) {
    if (service->write(service->ctx, &gpu.region, at, t.data, t.bytes) != WP_OK) {
      return Error(Code::kInternal, "cannot copy {} to the device", name);
    }
    tf::TensorView view = t;
    view.data = static_cast<const uint8_t*>(gpu.region.ptr) + at;
    views.emplace(name, view);
    at += (t.bytes + 255) / 256 * 256;
  }
  gpu.weight_bytes = bytes;
  Result<tf::ModelWeights> weights = tf::BindWeights(checkpoint.config(), views, "probe");
  if (!weights.ok()) return weights.status();
  gpu.weights = *weights;
  std::string why;
  gpu.sequence = tf::StartGpuSequence(checkpoint.config(), *weights, service, context, &why);
  if (!gpu.sequence) return Error(Code::kFailedPrecondition, "the GPU forward pass did not start: {}", why);
  return OkStatus();
}

int Logits(const std::string& dir, const std::vector<int32_t>& tokens, const std::string& device, uint32_t greedy) {
  Result<std::unique_ptr<tf::Checkpoint>> checkpoint = tf::Checkpoint::Open(dir);  // no tokenizer needed
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  const tf::Checkpoint& c = **checkpoint;
  const tf::Config& config = c.config();
  const uint32_t context = static_cast<uint32_t>(tokens.size()) + greedy + 1;
  OnGpu gpu;
  std::unique_ptr<tf::CpuModel> model;
  std::unique_ptr<tf::KvCache> cache;
  std::unique_ptr<tf::Sequence> cpu;
  tf::Sequence* sequence = nullptr;
  if (device == "gpu") {
    if (Status s = StartOnGpu(c, context, gpu); !s.ok()) return Fail(s);
    sequence = gpu.sequence.get();
  } else {
    Result<tf::ModelWeights> weights = tf::BindWeights(config, c.tensors(), dir);
    if (!weights.ok()) return Fail(weights.status());
    model = std::make_unique<tf::CpuModel>(config, *weights, 4);
    cache = std::make_unique<tf::KvCache>(config, context);
    cpu = std::make_unique<tf::CpuSequence>(*model, *cache);
    sequence = cpu.get();
  }
  std::vector<float> logits(config.vocab_size);
  if (Status s = sequence->Forward(tokens, 0, logits); !s.ok()) return Fail(s);
  Json out{{"device", sequence->Describe()}, {"logits", logits}};
  if (greedy > 0) {
    tf::GenerationRequest request;
    request.prompt = tokens;
    request.max_tokens = greedy;
    request.sampling.temperature = 0;
    Result<tf::Generation> generated = tf::Generate(*sequence, request);
    if (!generated.ok()) return Fail(generated.status());
    out["greedy"] = generated->tokens;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int Encode(const std::string& dir, const std::string& texts_file) {
  Result<tf::ModelDirectory> m = tf::ModelDirectory::Open(dir);
  if (!m.ok()) return Fail(m.status());
  std::ifstream in(texts_file);
  Json ids = Json::array(), with_special = Json::array();
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const std::string text = Json::parse(line).get<std::string>();
    Result<std::vector<int32_t>> plain = m->tokenizer->Encode(text, false);
    Result<std::vector<int32_t>> special = m->tokenizer->Encode(text, true);
    if (!plain.ok()) return Fail(plain.status());
    if (!special.ok()) return Fail(special.status());
    ids.push_back(*plain);
    with_special.push_back(*special);
  }
  std::printf("%s\n", Json{{"ids", ids}, {"ids_with_special_tokens", with_special}}.dump().c_str());
  return 0;
}

// A device-to-device copy of `bytes`, the median of five, in GB/s of bytes moved (read + written).
Result<double> CopyBandwidth(uint64_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
    return Error(Code::kResourceExhausted, "cudaMalloc of {} bytes failed", bytes);
  }
  std::vector<double> seconds;
  cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);  // warm up
  for (int i = 0; i < 5; i++) {
    cudaDeviceSynchronize();
    const auto t0 = std::chrono::steady_clock::now();
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  cudaFree(a);
  cudaFree(b);
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(bytes) / seconds[2] / 1e9;
}

// Continuous batching's gain: kStreams sequences decoding in the same steps (GpuSlots), their
// tokens a second together, on the model `gpu` holds.
constexpr uint32_t kStreams = 8;
Result<double> StreamsTogether(const tf::Config& config, OnGpu& gpu, uint32_t tokens) {
  const uint32_t context = tokens + 16;
  std::string why;
  std::unique_ptr<tf::GpuModel> model = tf::StartGpuModel(config, gpu.weights, gpu.memory->service(), context,
                                                           kStreams, tf::KvPoolBlocks(context, kStreams), &why);
  if (!model) return Error(Code::kFailedPrecondition, "the GPU model for {} streams did not start: {}", kStreams, why);
  Result<std::unique_ptr<tf::KvPool>> pool = tf::MakeGpuPool(*model);
  if (!pool.ok()) return pool.status();
  tf::KvCache first(**pool, context);
  tf::GpuSlots slots(*model, **pool, first, kStreams);
  // Different prompts (no prefix shared), then every stream's next token in each step, its logits
  // copied back as the one stream's are.
  std::vector<std::vector<int32_t>> prompts(kStreams);
  std::vector<tf::SequenceSlots::Run> runs;
  for (uint32_t s = 0; s < kStreams; s++) {
    prompts[s] = {static_cast<int32_t>(1 + s), 2, 3, 4};
    runs.push_back({s, prompts[s], 0});
  }
  std::vector<float> logits(uint64_t{kStreams} * config.vocab_size);
  std::vector<int32_t> argmax(kStreams);
  if (Status s = slots.Step(runs, logits, argmax); !s.ok()) return s;
  const int32_t token = 5;
  auto step = [&](uint32_t position) {
    for (tf::SequenceSlots::Run& run : runs) run = {run.slot, {&token, 1}, position};
    return slots.Step(runs, logits, argmax);
  };
  for (uint32_t i = 0; i < 4; i++) {  // warm up
    if (Status s = step(4 + i); !s.ok()) return s;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < tokens; i++) {
    if (Status s = step(8 + i); !s.ok()) return s;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return kStreams * tokens / seconds;
}

int DecodeSpeed(const std::string& dir, uint32_t tokens) {
  Result<std::unique_ptr<tf::Checkpoint>> checkpoint = tf::Checkpoint::Open(dir);
  if (!checkpoint.ok()) return Fail(checkpoint.status());
  const tf::Checkpoint& c = **checkpoint;
  OnGpu gpu;
  if (Status s = StartOnGpu(c, tokens + 8, gpu); !s.ok()) return Fail(s);
  // What a decode step reads: every weight, but of an embedding table that is not also the output
  // head only one row.
  uint64_t read_bytes = gpu.weight_bytes;
  if (!c.config().tie_word_embeddings) {
    for (const auto& [name, t] : c.tensors()) {
      if (name == "model.embed_tokens.weight") read_bytes -= t.bytes - t.bytes / c.config().vocab_size;
    }
  }
  std::vector<float> logits(c.config().vocab_size);
  std::vector<int32_t> prompt = {1, 2, 3, 4};
  if (Status s = gpu.sequence->Forward(prompt, 0, logits); !s.ok()) return Fail(s);
  int32_t token = 5;
  for (uint32_t i = 0; i < 4; i++) gpu.sequence->Forward({&token, 1}, 4 + i, logits);  // warm up
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < tokens; i++) {
    if (Status s = gpu.sequence->Forward({&token, 1}, 4 + i, logits); !s.ok()) return Fail(s);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Result<double> bandwidth = CopyBandwidth(std::max<uint64_t>(gpu.weight_bytes, uint64_t{256} << 20));
  if (!bandwidth.ok()) return Fail(bandwidth.status());
  const double tokens_per_second = tokens / seconds;
  const double read_gbs = tokens_per_second * static_cast<double>(read_bytes) / 1e9;
  Result<double> together = StreamsTogether(c.config(), gpu, tokens);
  if (!together.ok()) return Fail(together.status());
  Json out{{"device", gpu.sequence->Describe()},
           {"streams", kStreams},
           {"streams_tokens_per_second", *together},
           {"streams_vs_one", *together / tokens_per_second},
           {"streams_goal", ">= 5"},
           {"weight_bytes", gpu.weight_bytes},
           {"bytes_read_per_token", read_bytes},
           {"decode_tokens_per_second", tokens_per_second},
           {"weights_read_gbs", read_gbs},
           {"copy_bandwidth_gbs", *bandwidth},
           {"fraction_of_bandwidth", read_gbs / *bandwidth},
           {"goal", ">= 0.6"}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace warmpool

int main(int argc, char** argv) {
  CLI::App app{"the transformer engine's logits, tokens and decode speed on one model directory, as JSON"};
  app.require_subcommand(1);
  std::string dir, device = "gpu", texts;
  std::vector<int32_t> tokens;
  uint32_t greedy = 0, count = 128;
  CLI::App* logits = app.add_subcommand("logits", "the last token's logits, and greedy tokens from there");
  logits->add_option("DIR", dir)->required();
  logits->add_option("--tokens", tokens, "token ids")->delimiter(',')->required();
  logits->add_option("--device", device)->check(CLI::IsMember({"cpu", "gpu"}));
  logits->add_option("--greedy", greedy, "greedy tokens to generate after the prompt");
  CLI::App* encode = app.add_subcommand("encode", "tokenize each line (a JSON string) of a file");
  encode->add_option("DIR", dir)->required();
  encode->add_option("--texts", texts)->required();
  CLI::App* speed = app.add_subcommand("decode-speed", "decode tokens/s on the GPU against the copy bandwidth");
  speed->add_option("DIR", dir)->required();
  speed->add_option("--tokens", count, "tokens to time (default 128)");
  if (int rc = warmpool::ParseCommandLine(app, argc, argv); rc >= 0) return rc;
  if (*logits) return warmpool::Logits(dir, tokens, device, greedy);
  if (*encode) return warmpool::Encode(dir, texts);
  return warmpool::DecodeSpeed(dir, count);
}
