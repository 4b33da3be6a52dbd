#include "engines/transformer/config.h"

#include <cmath>
#include <limits>
#include <numbers>

#include <nlohmann/json.hpp>

#include "common/utf8.h"
#include "engines/json_describe.h"

namespace warmpool::transformer {
namespace {

using Json = nlohmann::json;

// Bounds far above any released model and far below what would overflow a size computation.
constexpr uint64_t kMaxWidth = 1u << 20;
constexpr uint64_t kMaxLayers = 1024;
constexpr uint64_t kMaxVocab = 1u << 24;
constexpr uint64_t kMaxPositions = 1u << 24;

class Reader {
 public:
  Reader(const Json& json, std::string_view source) : json_(json), source_(source) {}

  Result<uint64_t> Count(const char* key, uint64_t max, std::optional<uint64_t> fallback = std::nullopt) const {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(Code::kInvalidArgument, "{}: \"{}\" is missing", source_, key);
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<uint64_t>() > max) {
      return Error(Code::kInvalidArgument, "{}: \"{}\" is {}: expected a whole number from 1 to {}", source_, key,
                   DescribeJson(*it), max);
    }
    return it->get<uint64_t>();
  }

  Result<double> Positive(const Json& object, const char* key, std::optional<double> fallback) const {
    auto it = object.find(key);
    if (it == object.end() || it->is_null()) {
      if (fallback) return *fallback;
      return Error(Code::kInvalidArgument, "{}: \"{}\" is missing", source_, key);
    }
    if (!it->is_number() || !(it->get<double>() > 0) || !std::isfinite(it->get<double>())) {
      return Error(Code::kInvalidArgument, "{}: \"{}\" is {}: expected a positive number", source_, key, DescribeJson(*it));
    }
    return it->get<double>();
  }

  Result<bool> Flag(const char* key, bool fallback) const {
    auto it = json_.find(key);
    if (it == json_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return Error(Code::kInvalidArgument, "{}: \"{}\" is {}: expected true or false", source_, key, DescribeJson(*it));
    return it->get<bool>();
  }

  std::string Text(const Json& object, const char* key) const {
    auto it = object.find(key);
    return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
  }

 private:
  const Json& json_;
  std::string_view source_;
};

#define WP_ASSIGN(target, expression)             \
  do {                                            \
    auto result_ = (expression);                  \
    if (!result_.ok()) return result_.status();   \
    target = static_cast<decltype(target)>(*result_); \
  } while (0)

Status ParseRopeScaling(const Json& json, const Reader& read, std::string_view source, RopeScaling* out) {
  auto it = json.find("rope_scaling");
  if (it == json.end() || it->is_null()) return OkStatus();
  if (!it->is_object()) return Error(Code::kInvalidArgument, "{}: \"rope_scaling\" is not an object", source);
  std::string type = read.Text(*it, "rope_type");
  if (type.empty()) type = read.Text(*it, "type");  // the older spelling
  if (type.empty() || type == "default") return OkStatus();
  if (type == "linear") {
    out->kind = RopeScaling::Kind::kLinear;
    WP_ASSIGN(out->factor, read.Positive(*it, "factor", std::nullopt));
    return OkStatus();
  }
  if (type == "llama3") {
    out->kind = RopeScaling::Kind::kLlama3;
    WP_ASSIGN(out->factor, read.Positive(*it, "factor", std::nullopt));
    WP_ASSIGN(out->low_freq_factor, read.Positive(*it, "low_freq_factor", std::nullopt));
    WP_ASSIGN(out->high_freq_factor, read.Positive(*it, "high_freq_factor", std::nullopt));
    double original = 0;
    WP_ASSIGN(original, read.Positive(*it, "original_max_position_embeddings", std::nullopt));
    if (original > kMaxPositions) {
      return Error(Code::kInvalidArgument, "{}: rope_scaling original_max_position_embeddings {} is more than {}",
                   source, original, kMaxPositions);
    }
    out->original_max_position_embeddings = static_cast<uint64_t>(original);
    if (!(out->high_freq_factor > out->low_freq_factor)) {
      return Error(Code::kInvalidArgument, "{}: rope_scaling \"llama3\" needs high_freq_factor above low_freq_factor",
                   source);
    }
    return OkStatus();
  }
  return Error(Code::kInvalidArgument,
               "{}: rope_scaling type \"{}\" is not supported (supported: default, linear, llama3)", source, type);
}

}  // namespace

std::string_view ArchitectureName(Architecture architecture) {
  switch (architecture) {
    case Architecture::kLlama: return "llama";
    case Architecture::kMistral: return "mistral";
    case Architecture::kQwen2: return "qwen2";
    case Architecture::kQwen3: return "qwen3";
  }
  return "?";
}

Result<Config> Config::Parse(std::string_view json_text, std::string_view source) {
  Result<Config> config = ParseJson(json_text, source);
  if (!config.ok()) return ValidUtf8(config.status());
  return config;
}

Result<Config> Config::ParseJson(std::string_view json_text, std::string_view source) {
  Json json;
  try {
    json = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Error(Code::kInvalidArgument, "{}: not JSON: {}", source, e.what());
  }
  if (!json.is_object()) return Error(Code::kInvalidArgument, "{}: not a JSON object", source);
  Reader read(json, source);
  Config c;
  const std::string model_type = read.Text(json, "model_type");
  if (model_type == "llama") c.architecture = Architecture::kLlama;
  else if (model_type == "mistral") c.architecture = Architecture::kMistral;
  else if (model_type == "qwen2") c.architecture = Architecture::kQwen2;
  else if (model_type == "qwen3") c.architecture = Architecture::kQwen3;
  else {
    return Error(Code::kInvalidArgument,
                 "{}: model_type \"{}\" is not supported (supported: llama, mistral, qwen2, qwen3)", source,
                 model_type);
  }
  const std::string act = read.Text(json, "hidden_act");
  if (!act.empty() && act != "silu") {
    return Error(Code::kInvalidArgument, "{}: hidden_act \"{}\" is not supported (supported: silu)", source, act);
  }
  WP_ASSIGN(c.vocab_size, read.Count("vocab_size", kMaxVocab));
  WP_ASSIGN(c.hidden_size, read.Count("hidden_size", kMaxWidth));
  WP_ASSIGN(c.intermediate_size, read.Count("intermediate_size", kMaxWidth));
  WP_ASSIGN(c.num_hidden_layers, read.Count("num_hidden_layers", kMaxLayers));
  WP_ASSIGN(c.num_attention_heads, read.Count("num_attention_heads", kMaxWidth));
  WP_ASSIGN(c.num_key_value_heads, read.Count("num_key_value_heads", kMaxWidth, c.num_attention_heads));
  if (auto it = json.find("head_dim"); (it == json.end() || it->is_null()) && c.hidden_size % c.num_attention_heads != 0) {
    return Error(Code::kInvalidArgument,
                 "{}: hidden_size {} is not a multiple of num_attention_heads {}, and no \"head_dim\" says the "
                 "size of a head",
                 source, c.hidden_size, c.num_attention_heads);
  }
  WP_ASSIGN(c.head_dim, read.Count("head_dim", kMaxWidth, c.hidden_size / c.num_attention_heads));
  WP_ASSIGN(c.max_position_embeddings, read.Count("max_position_embeddings", kMaxPositions));
  WP_ASSIGN(c.rms_norm_eps, read.Positive(json, "rms_norm_eps", 1e-6));
  WP_ASSIGN(c.rope_theta, read.Positive(json, "rope_theta", 10000.0));
  WP_ASSIGN(c.tie_word_embeddings, read.Flag("tie_word_embeddings", false));
  if (Status s = ParseRopeScaling(json, read, source, &c.rope_scaling); !s.ok()) return s;

  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Error(Code::kInvalidArgument, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                 source, c.num_attention_heads, c.num_key_value_heads);
  }
  // Every width the forward pass sizes a buffer by stays within kMaxWidth, so that no product of
  // two of them (heads x head size, rows x width) wraps around 32 bits.
  if (uint64_t{c.num_attention_heads} * c.head_dim > kMaxWidth) {
    return Error(Code::kInvalidArgument, "{}: num_attention_heads {} x head_dim {} is more than {}", source,
                 c.num_attention_heads, c.head_dim, kMaxWidth);
  }
  if (c.head_dim % 2 != 0) {
    return Error(Code::kInvalidArgument, "{}: head_dim {} is odd: rotary embeddings rotate pairs", source, c.head_dim);
  }
  if (auto it = json.find("partial_rotary_factor"); it != json.end() && !(it->is_number() && it->get<double>() == 1.0)) {
    return Error(Code::kInvalidArgument, "{}: partial_rotary_factor {} is not supported (only 1)", source, DescribeJson(*it));
  }
  bool mlp_bias = false;
  WP_ASSIGN(mlp_bias, read.Flag("mlp_bias", false));
  if (mlp_bias) return Error(Code::kInvalidArgument, "{}: mlp_bias true is not supported", source);

  switch (c.architecture) {
    case Architecture::kLlama:
      WP_ASSIGN(c.attention_bias, read.Flag("attention_bias", false));
      c.output_bias = c.attention_bias;
      break;
    case Architecture::kMistral:
      if (auto it = json.find("sliding_window"); it != json.end() && !it->is_null()) {
        WP_ASSIGN(c.sliding_window, read.Count("sliding_window", kMaxPositions));
      }
      break;
    case Architecture::kQwen2:
    case Architecture::kQwen3: {
      bool sliding = false;
      WP_ASSIGN(sliding, read.Flag("use_sliding_window", false));
      if (sliding) {
        return Error(Code::kInvalidArgument, "{}: use_sliding_window true is not supported for {}", source, model_type);
      }
      if (c.architecture == Architecture::kQwen2) {
        c.attention_bias = true;  // Qwen2's q, k and v projections always have one; o has none
      } else {
        WP_ASSIGN(c.attention_bias, read.Flag("attention_bias", false));
        c.output_bias = c.attention_bias;
        c.qk_norm = true;
      }
      break;
    }
  }
  return c;
}

std::vector<double> Config::RotaryFrequencies() const {
  // inv_freq[i] = theta^(-2i/d), then the scaling.
  std::vector<double> frequencies;
  const uint32_t half = head_dim / 2;
  const RopeScaling& s = rope_scaling;
  for (uint32_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(rope_theta, 2.0 * i / head_dim);
    if (s.kind == RopeScaling::Kind::kLinear) f /= s.factor;
    if (s.kind == RopeScaling::Kind::kLlama3) {
      // Long wavelengths are stretched by factor, short ones kept, and those between blended.
      const double original = static_cast<double>(s.original_max_position_embeddings);
      const double wavelength = 2 * std::numbers::pi / f;
      if (wavelength > original / s.low_freq_factor) {
        f /= s.factor;
      } else if (wavelength >= original / s.high_freq_factor) {
        const double smooth = (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    frequencies.push_back(f);
  }
  return frequencies;
}

}  // namespace warmpool::transformer
