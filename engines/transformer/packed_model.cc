#include "engines/transformer/packed_model.h"

#include <algorithm>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/transformer/decode_attention.h"
#include "engines/transformer/gpu_sequence.h"
#include "engines/transformer/kv_cache.h"
#include "engines/transformer/weights.h"

namespace warmpool::transformer {
namespace {

using Json = nlohmann::json;

// Names the format: a description of another version is refused, never misread.
constexpr char kFormatKey[] = "warmpool_transformer";
constexpr int kFormatVersion = 1;

// A prompt's prefill computes this many rows at once at most (the activations counted).
constexpr uint64_t kPrefillRows = 512;
// What the engine serves when the configuration does not say (and the model allows it).
constexpr uint32_t kDefaultContext = 4096;

uint64_t AlignUp(uint64_t n) { return (n + kRegionAlignment - 1) / kRegionAlignment * kRegionAlignment; }

}  // namespace

uint32_t ServedContext(const Config& config, uint32_t asked) {
  uint64_t context = asked != 0 ? asked : kDefaultContext;
  if (config.max_position_embeddings != 0) context = std::min<uint64_t>(context, config.max_position_embeddings);
  return static_cast<uint32_t>(std::max<uint64_t>(context, 1));
}

uint64_t WorkspaceBytes(const Config& config, uint32_t context, uint32_t sequences, uint64_t kv_tokens) {
  // The KV pool, in whole blocks (engines/transformer/kv_cache.h).
  const uint64_t kv = config.KvBytesPerToken() * KvPoolBlocks(context, sequences, kv_tokens) * kKvBlockTokens;
  // Per prefill row: the residual stream, its norm, q, k, v, the attention output, the MLP's gate,
  // up and product; and the logits of the last row.
  const uint64_t row = uint64_t{config.hidden_size} * 3 + config.q_size() * 2 + config.kv_size() * 2 +
                       uint64_t{config.intermediate_size} * 3;
  // A step's rows are at most a prompt's piece (kPrefillRows) and its logits one row per sequence.
  const uint64_t activations =
      (std::min<uint64_t>(context, kPrefillRows) * row + uint64_t{config.vocab_size} * sequences) * sizeof(float);
  return kv + activations;
}

Result<PackedModel> DescribeDirectory(int dir, const std::string& shown, std::string* tokenizer) {
  Result<std::unique_ptr<Checkpoint>> checkpoint = Checkpoint::OpenAt(dir, shown);
  if (!checkpoint.ok()) return checkpoint.status();
  const Checkpoint& c = **checkpoint;
  // Every tensor the architecture needs, with its shape: checked now, at registration.
  if (Result<ModelWeights> bound = BindWeights(c.config(), c.tensors(), shown); !bound.ok()) return bound.status();
  Result<TextFiles> texts = TextFiles::Read(dir, shown, nullptr);
  if (!texts.ok()) return texts.status();
  if (Result<ServingFiles> serving = ServingFiles::Parse(*texts, c.config().vocab_size, shown); !serving.ok()) {
    return serving.status();
  }
  PackedModel model;
  model.config = c.config();
  model.config_text = c.config_text();
  model.files = c.files();
  uint64_t offset = 0;
  for (const auto& [name, view] : c.tensors()) {  // by name: the same directory, the same layout
    model.tensors.push_back(PackedTensor{name, view.dtype, view.shape, offset, view.bytes, view.file, view.file_offset});
    offset = AlignUp(offset + view.bytes);
  }
  model.tokenizer_offset = offset;
  model.tokenizer_bytes = texts->tokenizer.size();
  model.region_bytes = AlignUp(offset + model.tokenizer_bytes);
  if (tokenizer != nullptr) *tokenizer = std::move(texts->tokenizer);
  texts->tokenizer.clear();
  model.texts = std::move(*texts);
  return model;
}

std::string EncodeHeader(const PackedModel& model) {
  Json tensors = Json::array();
  for (const PackedTensor& t : model.tensors) {
    tensors.push_back(Json::array({t.name, std::string(safetensors::DTypeName(t.dtype)), t.shape, t.offset, t.bytes,
                                   t.file, t.file_offset}));
  }
  Json header = {
      {kFormatKey, kFormatVersion},
      {"config", model.config_text},
      {"tokenizer_config", model.texts.tokenizer_config},
      {"generation_config", model.texts.generation_config},
      {"files", model.files},
      {"tensors", std::move(tensors)},
      {"tokenizer", Json::array({model.tokenizer_offset, model.tokenizer_bytes})},
      {"region_bytes", model.region_bytes},
  };
  return header.dump(-1, ' ', false, Json::error_handler_t::replace);
}

bool IsPackedHeader(std::string_view header) {
  return header.size() > 2 && header.front() == '{' && header.find(kFormatKey) != std::string_view::npos;
}

namespace {

Result<PackedModel> Decode(std::string_view header) {
  Json json = Json::parse(header);
  if (!json.is_object() || json.value(kFormatKey, 0) != kFormatVersion) {
    return Error(Code::kInvalidArgument, "not a transformer model's description (format {})", kFormatVersion);
  }
  PackedModel model;
  model.config_text = json.at("config").get<std::string>();
  Result<Config> config = Config::Parse(model.config_text, "the model's config.json");
  if (!config.ok()) return config.status();
  model.config = *config;
  model.texts.tokenizer_config = json.at("tokenizer_config").get<std::string>();
  model.texts.generation_config = json.at("generation_config").get<std::string>();
  model.files = json.at("files").get<std::vector<std::string>>();
  model.region_bytes = json.at("region_bytes").get<uint64_t>();
  model.tokenizer_offset = json.at("tokenizer").at(0).get<uint64_t>();
  model.tokenizer_bytes = json.at("tokenizer").at(1).get<uint64_t>();
  auto within = [&](uint64_t offset, uint64_t bytes) {
    return offset <= model.region_bytes && bytes <= model.region_bytes - offset;
  };
  if (!within(model.tokenizer_offset, model.tokenizer_bytes)) {
    return Error(Code::kInvalidArgument, "the tokenizer lies outside the region");
  }
  for (const Json& t : json.at("tensors")) {
    PackedTensor tensor;
    tensor.name = t.at(0).get<std::string>();
    std::optional<safetensors::DType> dtype = safetensors::DTypeFromName(t.at(1).get<std::string>());
    if (!dtype) return Error(Code::kInvalidArgument, "tensor \"{}\" has an unknown dtype", tensor.name);
    tensor.dtype = *dtype;
    tensor.shape = t.at(2).get<std::vector<uint64_t>>();
    tensor.offset = t.at(3).get<uint64_t>();
    tensor.bytes = t.at(4).get<uint64_t>();
    tensor.file = t.at(5).get<uint32_t>();
    tensor.file_offset = t.at(6).get<uint64_t>();
    if (!within(tensor.offset, tensor.bytes) || tensor.file >= model.files.size()) {
      return Error(Code::kInvalidArgument, "tensor \"{}\" lies outside the region or its files", tensor.name);
    }
    // Its bytes are its shape's: the forward pass reads as far as the shape says.
    uint64_t elements = 1;
    for (uint64_t d : tensor.shape) {
      if (d != 0 && elements > UINT64_MAX / d) return Error(Code::kInvalidArgument, "tensor \"{}\" is too large", tensor.name);
      elements *= d;
    }
    if (elements > UINT64_MAX / safetensors::DTypeSize(tensor.dtype) ||
        elements * safetensors::DTypeSize(tensor.dtype) != tensor.bytes) {
      return Error(Code::kInvalidArgument, "tensor \"{}\" holds {} bytes, not what its shape needs", tensor.name,
                   tensor.bytes);
    }
    model.tensors.push_back(std::move(tensor));
  }
  return model;
}

}  // namespace

Result<PackedModel> DecodeHeader(std::string_view header) {
  try {
    Result<PackedModel> model = Decode(header);
    if (!model.ok()) return ValidUtf8(model.status());
    return model;
  } catch (const Json::exception& e) {
    return ValidUtf8(Error(Code::kInvalidArgument, "not a transformer model's description: {}", e.what()));
  }
}

KvElement ServedKvElement(const PackedModel& model, bool on_device) {
  // BF16 when every key and value projection is, F32 otherwise.
  bool any = false;
  for (const PackedTensor& t : model.tensors) {
    if (!t.name.ends_with("self_attn.k_proj.weight") && !t.name.ends_with("self_attn.v_proj.weight")) continue;
    if (t.dtype != safetensors::DType::BF16) return ChooseKvElement(safetensors::DType::F32, model.config.head_dim, on_device);
    any = true;
  }
  return ChooseKvElement(any ? safetensors::DType::BF16 : safetensors::DType::F32, model.config.head_dim, on_device);
}

bool HasOutputHead(const PackedModel& model) {
  if (model.config.tie_word_embeddings) return true;
  return std::any_of(model.tensors.begin(), model.tensors.end(),
                     [](const PackedTensor& t) { return t.name == "lm_head.weight"; });
}

uint64_t ServedWorkspaceBytes(const Config& config, uint32_t context, uint32_t sequences, uint64_t kv_tokens,
                              bool on_device) {
  return on_device ? PlanGpu(config, context, sequences, KvPoolBlocks(context, sequences, kv_tokens)).total
                   : WorkspaceBytes(config, context, sequences, kv_tokens);
}

}  // namespace warmpool::transformer
