// warmpool-mkmodel: writes a dense (MLP) model with random weights as a safetensors file, the way
// PyTorch would save nn.Sequential(Linear, act, Linear, ...), or (--arch) a random-initialised
// Hugging Face decoder checkpoint directory, so that tests and benchmarks have models of any shape
// without a Python toolchain.
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/command_line.h"
#include "common/status.h"
#include "common/units.h"
#include "engines/half.h"
#include "engines/safetensors.h"
#include "engines/transformer/random_checkpoint.h"

namespace warmpool {
namespace {

using safetensors::DType;
using safetensors::TensorToWrite;

constexpr int kExitUsage = 2;
constexpr int kExitIo = 1;

struct ModelSpec {
  std::vector<uint64_t> widths;  // in, hidden..., out
  std::string activation = "relu";
  DType dtype = DType::F32;
  uint64_t seed = 0;
};

Result<std::vector<uint64_t>> ParseWidths(const std::string& text) {
  std::vector<uint64_t> widths;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 10 ||
        std::stoull(item) == 0 || std::stoull(item) > INT_MAX) {
      return Error(Code::kInvalidArgument, "--layers \"{}\": \"{}\" is not a width between 1 and {}", text,
                   item, INT_MAX);
    }
    widths.push_back(std::stoull(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (widths.size() < 2) {
    return Error(Code::kInvalidArgument, "--layers \"{}\": give at least an input and an output width, "
                 "e.g. 64,256,10", text);
  }
  return widths;
}

Result<DType> ParseDType(const std::string& text) {
  if (text == "f32") return DType::F32;
  if (text == "f16") return DType::F16;
  if (text == "bf16") return DType::BF16;
  return Error(Code::kInvalidArgument, "--dtype \"{}\": expected f32, f16 or bf16", text);
}

// Uniform in [-bound, bound) from raw generator bits, so a seed gives the same model everywhere
// (std::uniform_real_distribution differs between standard libraries).
float UniformSample(std::mt19937_64& generator, double bound) {
  const double unit = static_cast<double>(generator() >> 11) * 0x1p-53;
  return static_cast<float>((2.0 * unit - 1.0) * bound);
}

void AppendValue(float value, DType dtype, std::vector<uint8_t>& bytes) {
  uint8_t encoded[4];
  size_t size = 4;
  if (dtype == DType::F32) {
    std::memcpy(encoded, &value, 4);
  } else {
    uint16_t half = dtype == DType::F16 ? safetensors::FloatToHalf(value) : safetensors::FloatToBF16(value);
    std::memcpy(encoded, &half, 2);
    size = 2;
  }
  bytes.insert(bytes.end(), encoded, encoded + size);
}

TensorToWrite RandomTensor(std::string name, std::vector<uint64_t> shape, double bound, const ModelSpec& spec,
                           std::mt19937_64& generator) {
  TensorToWrite tensor{std::move(name), spec.dtype, std::move(shape), {}};
  uint64_t count = 1;
  for (uint64_t dim : tensor.shape) count *= dim;
  tensor.data.reserve(count * safetensors::DTypeSize(spec.dtype));
  for (uint64_t i = 0; i < count; ++i) AppendValue(UniformSample(generator, bound), spec.dtype, tensor.data);
  return tensor;
}

// Writes a temporary file beside out_path and renames it, so a crash never leaves half a model.
Status WriteModel(const std::string& out_path, const ModelSpec& spec) {
  std::mt19937_64 generator(spec.seed);
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i + 1 < spec.widths.size(); ++i) {
    const uint64_t in = spec.widths[i];
    const uint64_t out = spec.widths[i + 1];
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));  // PyTorch's Linear init range
    const std::string index = std::to_string(2 * i);
    tensors.push_back(RandomTensor(index + ".weight", {out, in}, bound, spec, generator));
    tensors.push_back(RandomTensor(index + ".bias", {out}, bound, spec, generator));
  }
  const std::string temp_path = fmt::format("{}.tmp.{}", out_path, getpid());
  Status written = safetensors::WriteFile(temp_path, tensors, {{"activation", spec.activation}, {"engine", "dense"}});
  if (!written.ok()) return written;
  if (std::rename(temp_path.c_str(), out_path.c_str()) != 0) {
    Status renamed = Error(Code::kInternal, "cannot rename \"{}\" to \"{}\": {}", temp_path, out_path,
                           std::strerror(errno));
    unlink(temp_path.c_str());
    return renamed;
  }
  return OkStatus();
}

int Fail(const Status& status, int exit_code) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return exit_code;
}

// --rope-scaling: none, linear:FACTOR or llama3:FACTOR (Llama 3.1's low 1, high 4, original 8192).
Result<transformer::RopeScaling> ParseRopeScaling(const std::string& text) {
  transformer::RopeScaling scaling;
  if (text == "none") return scaling;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  char* end = nullptr;
  const double factor = colon == std::string::npos ? 0 : std::strtod(text.c_str() + colon + 1, &end);
  if ((kind != "linear" && kind != "llama3") || !(factor > 0) || !std::isfinite(factor) || end == nullptr || *end != 0) {
    return Error(Code::kInvalidArgument, "--rope-scaling \"{}\": expected none, linear:FACTOR or llama3:FACTOR", text);
  }
  scaling.kind = kind == "linear" ? transformer::RopeScaling::Kind::kLinear : transformer::RopeScaling::Kind::kLlama3;
  scaling.factor = factor;
  return scaling;
}

Result<transformer::Architecture> ParseArchitecture(const std::string& text) {
  for (auto a : {transformer::Architecture::kLlama, transformer::Architecture::kMistral,
                 transformer::Architecture::kQwen2, transformer::Architecture::kQwen3}) {
    if (text == transformer::ArchitectureName(a)) return a;
  }
  return Error(Code::kInvalidArgument, "--arch \"{}\": expected llama, mistral, qwen2 or qwen3", text);
}

int Run(int argc, char** argv) {
  CLI::App app{
      "Writes a dense (MLP) model with random weights as a safetensors file for the warmpool \"dense\" engine.\n"
      "Tensors are named like PyTorch's nn.Sequential(Linear, act, Linear, ...): 0.weight [out, in], 0.bias,\n"
      "2.weight, ... Weights are uniform in +-1/sqrt(in) (PyTorch's Linear init) and depend only on --seed.\n"
      "Example: warmpool-mkmodel model.safetensors --layers 64,256,256,10 --activation gelu --dtype f16\n"
      "With --arch it writes a Hugging Face decoder checkpoint directory (config.json, model.safetensors) with\n"
      "random weights instead, for the transformer engine's tests and benchmarks.\n"
      "Example: warmpool-mkmodel tiny-llama --arch llama --hidden 64 --num-layers 2 --dtype bf16",
      "warmpool-mkmodel"};
  std::string out_path;
  std::string layers_text;
  std::string activation = "relu";
  std::string dtype_text = "f32";
  uint64_t seed = 0;
  std::string arch_text;
  transformer::RandomCheckpoint decoder;
  std::string rope_scaling_text = "none";
  app.add_option("OUT", out_path, "output file, e.g. model.safetensors (with --arch: a directory)")->required();
  auto* layers_option = app.add_option(
      "--layers", layers_text, "dense: comma-separated widths: input, hidden..., output (e.g. 64,256,256,10)");
  auto* activation_option =
      app.add_option("--activation", activation, "dense: relu, gelu, tanh or none, applied between layers (default relu)");
  app.add_option("--dtype", dtype_text, "storage dtype: f32, f16 or bf16 (default f32)");
  app.add_option("--seed", seed, "random seed; the same seed writes the same weights (default 0)");
  auto* arch_option = app.add_option(
      "--arch", arch_text,
      "write a Hugging Face decoder checkpoint directory instead: llama, mistral, qwen2 or qwen3");
  arch_option->excludes(layers_option)->excludes(activation_option);
  const char* group = "Decoder checkpoints (--arch)";
  app.add_option("--vocab", decoder.vocab_size, "vocabulary size (default 256)")->group(group);
  app.add_option("--hidden", decoder.hidden_size, "hidden size (default 64)")->group(group);
  app.add_option("--intermediate", decoder.intermediate_size, "MLP size (default 128)")->group(group);
  app.add_option("--num-layers", decoder.num_hidden_layers, "decoder layers (default 2)")->group(group);
  app.add_option("--heads", decoder.num_attention_heads, "attention heads (default 4)")->group(group);
  app.add_option("--kv-heads", decoder.num_key_value_heads, "key/value heads (default 2)")->group(group);
  app.add_option("--head-dim", decoder.head_dim, "head size (default hidden / heads)")->group(group);
  app.add_option("--context", decoder.max_position_embeddings, "max_position_embeddings (default 2048)")->group(group);
  app.add_option("--rope-theta", decoder.rope_theta, "rotary base (default 10000)")->group(group);
  app.add_option("--rope-scaling", rope_scaling_text, "none, linear:FACTOR or llama3:FACTOR (default none)")->group(group);
  app.add_option("--sliding-window", decoder.sliding_window, "mistral: attention window in tokens (default none)")
      ->group(group);
  app.add_flag("--tie-embeddings", decoder.tie_word_embeddings, "the output head is the embedding")->group(group);
  app.add_flag("--base-model-only", decoder.base_model_only,
               "the base model alone, as an embedding model's checkpoint: tensors without the \"model.\" "
               "prefix, and no output head (but the embedding, with --tie-embeddings)")
      ->group(group);
  app.add_flag("--attention-bias", decoder.attention_bias, "llama, qwen3: biases on q, k, v and o")->group(group);
  app.add_option("--shards", decoder.shards, "weights files, with an index when more than one (default 1)")
      ->group(group);
  for (CLI::Option* option : app.get_options()) {
    if (option->get_group() == group) option->needs(arch_option);
  }
  app.final_callback([&] {
    if (layers_text.empty() && arch_text.empty()) throw CLI::RequiredError("--layers (a dense model) or --arch");
  });
  if (int rc = ParseCommandLine(app, argc, argv); rc >= 0) return rc;  // --help, --version, usage

  if (!arch_text.empty()) {
    Result<transformer::Architecture> architecture = ParseArchitecture(arch_text);
    if (!architecture.ok()) return Fail(architecture.status(), kExitUsage);
    Result<DType> dtype = ParseDType(dtype_text);
    if (!dtype.ok()) return Fail(dtype.status(), kExitUsage);
    Result<transformer::RopeScaling> scaling = ParseRopeScaling(rope_scaling_text);
    if (!scaling.ok()) return Fail(scaling.status(), kExitUsage);
    decoder.architecture = *architecture;
    decoder.dtype = *dtype;
    decoder.rope_scaling = *scaling;
    decoder.seed = seed;
    Status written = transformer::WriteRandomCheckpoint(out_path, decoder);
    if (!written.ok()) return Fail(written, written.code() == Code::kInvalidArgument ? kExitUsage : kExitIo);
    std::printf("wrote %s: a %s decoder%s, %u layers, hidden %u, vocabulary %u, %s weights\n", out_path.c_str(),
                arch_text.c_str(),
                !decoder.base_model_only     ? ""
                : decoder.tie_word_embeddings ? " (its base model alone)"
                                              : " (its base model alone: no output head)",
                decoder.num_hidden_layers, decoder.hidden_size, decoder.vocab_size,
                std::string(safetensors::DTypeName(decoder.dtype)).c_str());
    return 0;
  }
  ModelSpec spec;
  spec.seed = seed;
  Result<std::vector<uint64_t>> widths = ParseWidths(layers_text);
  if (!widths.ok()) return Fail(widths.status(), kExitUsage);
  spec.widths = std::move(*widths);
  Result<DType> dtype = ParseDType(dtype_text);
  if (!dtype.ok()) return Fail(dtype.status(), kExitUsage);
  spec.dtype = *dtype;
  if (activation != "relu" && activation != "gelu" && activation != "tanh" && activation != "none") {
    return Fail(Error(Code::kInvalidArgument, "--activation \"{}\": expected relu, gelu, tanh or none", activation),
                kExitUsage);
  }
  spec.activation = activation;

  uint64_t parameters = 0;
  for (size_t i = 0; i + 1 < spec.widths.size(); ++i) parameters += spec.widths[i + 1] * (spec.widths[i] + 1);
  Status written = WriteModel(out_path, spec);
  if (!written.ok()) return Fail(written, kExitIo);
  std::printf("wrote %s: %zu layers, %llu parameters, %s of %s weights\n", out_path.c_str(), spec.widths.size() - 1,
              static_cast<unsigned long long>(parameters),
              FormatBytes(parameters * safetensors::DTypeSize(spec.dtype)).c_str(),
              std::string(safetensors::DTypeName(spec.dtype)).c_str());
  return 0;
}

}  // namespace
}  // namespace warmpool

int main(int argc, char** argv) {
  try {
    return warmpool::Run(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: RESOURCE_EXHAUSTED: out of memory generating the model\n");
    return 1;
  }
}
