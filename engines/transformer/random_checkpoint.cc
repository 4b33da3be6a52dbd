#include "engines/transformer/random_checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engines/half.h"

namespace warmpool::transformer {
namespace {

using safetensors::DType;
using safetensors::TensorToWrite;

class Generator {
 public:
  Generator(uint64_t seed, DType dtype) : engine_(seed), dtype_(dtype) {}

  // Uniform in [center - spread, center + spread]: PyTorch's Linear draws its weights and biases
  // uniform in ±1/sqrt(in); norm weights are drawn around 1 so that the test sees them applied.
  TensorToWrite Tensor(std::string name, std::vector<uint64_t> shape, double spread, double center = 0) {
    TensorToWrite t{std::move(name), dtype_, std::move(shape), {}};
    uint64_t count = 1;
    for (uint64_t d : t.shape) count *= d;
    t.data.reserve(count * safetensors::DTypeSize(dtype_));
    for (uint64_t i = 0; i < count; ++i) {
      // From raw generator bits, so that a seed gives the same checkpoint with any standard
      // library (std::uniform_real_distribution differs between them).
      const double unit = static_cast<double>(engine_() >> 11) * 0x1p-53;
      const auto value = static_cast<float>(center + (2.0 * unit - 1.0) * spread);
      uint8_t bytes[4];
      size_t size = 4;
      if (dtype_ == DType::F32) {
        std::memcpy(bytes, &value, 4);
      } else {
        const uint16_t half = dtype_ == DType::F16 ? safetensors::FloatToHalf(value) : safetensors::FloatToBF16(value);
        std::memcpy(bytes, &half, 2);
        size = 2;
      }
      t.data.insert(t.data.end(), bytes, bytes + size);
    }
    return t;
  }

 private:
  std::mt19937_64 engine_;
  DType dtype_;
};

std::vector<TensorToWrite> Tensors(const RandomCheckpoint& s, const Config& c) {
  Generator g(s.seed, s.dtype);
  const uint64_t hidden = c.hidden_size;
  const double in_hidden = 1 / std::sqrt(double(hidden));
  std::vector<TensorToWrite> t;
  const std::string base = s.base_model_only ? "" : "model.";
  t.push_back(g.Tensor(base + "embed_tokens.weight", {c.vocab_size, hidden}, 1.0));
  for (uint32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("{}layers.{}.", base, i);
    t.push_back(g.Tensor(p + "input_layernorm.weight", {hidden}, 0.5, 1.0));
    t.push_back(g.Tensor(p + "self_attn.q_proj.weight", {c.q_size(), hidden}, in_hidden));
    t.push_back(g.Tensor(p + "self_attn.k_proj.weight", {c.kv_size(), hidden}, in_hidden));
    t.push_back(g.Tensor(p + "self_attn.v_proj.weight", {c.kv_size(), hidden}, in_hidden));
    if (c.attention_bias) {
      t.push_back(g.Tensor(p + "self_attn.q_proj.bias", {c.q_size()}, in_hidden));
      t.push_back(g.Tensor(p + "self_attn.k_proj.bias", {c.kv_size()}, in_hidden));
      t.push_back(g.Tensor(p + "self_attn.v_proj.bias", {c.kv_size()}, in_hidden));
    }
    t.push_back(g.Tensor(p + "self_attn.o_proj.weight", {hidden, c.q_size()}, 1 / std::sqrt(double(c.q_size()))));
    if (c.output_bias) t.push_back(g.Tensor(p + "self_attn.o_proj.bias", {hidden}, in_hidden));
    if (c.qk_norm) {
      t.push_back(g.Tensor(p + "self_attn.q_norm.weight", {c.head_dim}, 0.5, 1.0));
      t.push_back(g.Tensor(p + "self_attn.k_norm.weight", {c.head_dim}, 0.5, 1.0));
    }
    t.push_back(g.Tensor(p + "post_attention_layernorm.weight", {hidden}, 0.5, 1.0));
    t.push_back(g.Tensor(p + "mlp.gate_proj.weight", {c.intermediate_size, hidden}, in_hidden));
    t.push_back(g.Tensor(p + "mlp.up_proj.weight", {c.intermediate_size, hidden}, in_hidden));
    t.push_back(g.Tensor(p + "mlp.down_proj.weight", {hidden, c.intermediate_size},
                         1 / std::sqrt(double(c.intermediate_size))));
  }
  t.push_back(g.Tensor(base + "norm.weight", {hidden}, 0.5, 1.0));
  if (!c.tie_word_embeddings && !s.base_model_only) {
    t.push_back(g.Tensor("lm_head.weight", {c.vocab_size, hidden}, in_hidden));
  }
  return t;
}

Status Rename(const std::string& from, const std::string& to) {
  if (std::rename(from.c_str(), to.c_str()) == 0) return OkStatus();
  Status failed = Error(Code::kInternal, "cannot rename \"{}\" to \"{}\": {}", from, to, std::strerror(errno));
  unlink(from.c_str());
  return failed;
}

Status WriteText(const std::string& path, const std::string& text) {
  const std::string temp = fmt::format("{}.tmp.{}", path, getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) return Error(Code::kInternal, "cannot write \"{}\"", temp);
  }
  return Rename(temp, path);
}

Status WriteTensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  const std::string temp = fmt::format("{}.tmp.{}", path, getpid());
  if (Status s = safetensors::WriteFile(temp, tensors, {{"format", "pt"}}); !s.ok()) return s;
  return Rename(temp, path);
}

}  // namespace

std::string ConfigJson(const RandomCheckpoint& s) {
  nlohmann::ordered_json j;
  const std::string model_class = s.architecture == Architecture::kLlama     ? "Llama"
                                  : s.architecture == Architecture::kMistral ? "Mistral"
                                  : s.architecture == Architecture::kQwen2   ? "Qwen2"
                                                                             : "Qwen3";
  j["architectures"] = {model_class + (s.base_model_only ? "Model" : "ForCausalLM")};
  j["model_type"] = std::string(ArchitectureName(s.architecture));
  j["vocab_size"] = s.vocab_size;
  j["hidden_size"] = s.hidden_size;
  j["intermediate_size"] = s.intermediate_size;
  j["num_hidden_layers"] = s.num_hidden_layers;
  j["num_attention_heads"] = s.num_attention_heads;
  j["num_key_value_heads"] = s.num_key_value_heads;
  if (s.head_dim != 0 || s.architecture == Architecture::kQwen3) {
    j["head_dim"] = s.head_dim != 0 ? s.head_dim : s.hidden_size / s.num_attention_heads;
  }
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = s.max_position_embeddings;
  j["rms_norm_eps"] = 1e-6;
  j["rope_theta"] = s.rope_theta;
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["torch_dtype"] = s.dtype == DType::F32 ? "float32" : s.dtype == DType::F16 ? "float16" : "bfloat16";
  switch (s.rope_scaling.kind) {
    case RopeScaling::Kind::kNone: j["rope_scaling"] = nullptr; break;
    case RopeScaling::Kind::kLinear: j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.rope_scaling.factor}}; break;
    case RopeScaling::Kind::kLlama3:
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", s.rope_scaling.factor},
                           {"low_freq_factor", s.rope_scaling.low_freq_factor},
                           {"high_freq_factor", s.rope_scaling.high_freq_factor},
                           {"original_max_position_embeddings", s.rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (s.architecture == Architecture::kLlama || s.architecture == Architecture::kQwen3) {
    j["attention_bias"] = s.attention_bias;
  }
  if (s.architecture == Architecture::kMistral) {
    j["sliding_window"] = s.sliding_window == 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s.sliding_window);
  }
  if (s.architecture == Architecture::kQwen2 || s.architecture == Architecture::kQwen3) j["use_sliding_window"] = false;
  return j.dump(2) + "\n";
}

Status WriteRandomCheckpoint(const std::string& directory, const RandomCheckpoint& spec) {
  const std::string config_text = ConfigJson(spec);
  Result<Config> config = Config::Parse(config_text, "the checkpoint asked for");
  if (!config.ok()) return config.status();
  if (spec.shards == 0) return Error(Code::kInvalidArgument, "a checkpoint needs at least one shard");
  if (mkdir(directory.c_str(), 0755) != 0 && errno != EEXIST) {
    return Error(Code::kInternal, "cannot create \"{}\": {}", directory, std::strerror(errno));
  }
  std::vector<TensorToWrite> tensors = Tensors(spec, *config);
  if (spec.shards == 1) {
    if (Status s = WriteTensors(directory + "/model.safetensors", tensors); !s.ok()) return s;
  } else {
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    uint64_t total = 0;
    const size_t per_shard = (tensors.size() + spec.shards - 1) / spec.shards;
    for (uint32_t shard = 0; shard < spec.shards; ++shard) {
      const std::string name = fmt::format("model-{:05}-of-{:05}.safetensors", shard + 1, spec.shards);
      const size_t begin = std::min(tensors.size(), shard * per_shard);
      const size_t end = std::min(tensors.size(), begin + per_shard);
      std::vector<TensorToWrite> part(std::make_move_iterator(tensors.begin() + begin),
                                      std::make_move_iterator(tensors.begin() + end));
      for (const TensorToWrite& t : part) {
        map[t.name] = name;
        total += t.data.size();
      }
      if (Status s = WriteTensors(directory + "/" + name, part); !s.ok()) return s;
    }
    nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    if (Status s = WriteText(directory + "/model.safetensors.index.json", index.dump(2) + "\n"); !s.ok()) return s;
  }
  return WriteText(directory + "/config.json", config_text);
}

}  // namespace warmpool::transformer
