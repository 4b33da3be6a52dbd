#include "engines/transformer/weights.h"

#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/utf8.h"
#include "engines/half.h"

namespace warmpool::transformer {
namespace {

using safetensors::DType;

class Binder {
 public:
  Binder(const std::map<std::string, TensorView>& tensors, std::string_view source)
      : tensors_(tensors), source_(source) {}

  Status status() const { return status_; }
  const std::set<std::string>& used() const { return used_; }
  uint64_t bytes() const { return bytes_; }

  Matrix Take(const std::string& name, uint64_t rows, uint64_t cols) {
    const TensorView* t = Find(name, {rows, cols});
    if (t == nullptr) return {};
    return Matrix{t->dtype, static_cast<uint32_t>(rows), static_cast<uint32_t>(cols), t->data};
  }

  Vector Take(const std::string& name, uint64_t size) {
    const TensorView* t = Find(name, {size});
    if (t == nullptr) return {};
    return Vector{t->dtype, static_cast<uint32_t>(size), t->data};
  }

 private:
  const TensorView* Find(const std::string& name, const std::vector<uint64_t>& shape) {
    if (!status_.ok()) return nullptr;
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      status_ = Error(Code::kInvalidArgument, "{}: tensor \"{}\" is missing", source_, name);
      return nullptr;
    }
    const TensorView& t = it->second;
    if (t.shape != shape) {
      status_ = Error(Code::kInvalidArgument, "{}: tensor \"{}\" is [{}], the config makes it [{}]", source_, name,
                      fmt::join(t.shape, ", "), fmt::join(shape, ", "));
      return nullptr;
    }
    if (t.dtype != DType::F32 && t.dtype != DType::F16 && t.dtype != DType::BF16) {
      status_ = Error(Code::kInvalidArgument, "{}: tensor \"{}\" is {}: supported are F32, F16 and BF16", source_,
                      name, safetensors::DTypeName(t.dtype));
      return nullptr;
    }
    used_.insert(name);
    uint64_t numel = 1;
    for (uint64_t d : shape) numel *= d;
    bytes_ += numel * safetensors::DTypeSize(t.dtype);
    return &t;
  }

  const std::map<std::string, TensorView>& tensors_;
  std::string_view source_;
  Status status_;
  std::set<std::string> used_;
  uint64_t bytes_ = 0;
};

// Tensors a checkpoint may carry that change nothing computed here: the rotary frequencies older
// Llama checkpoints saved (recomputed from the config), and a tied model's copy of its embedding.
bool Ignorable(const std::string& name, const Config& config) {
  if (name.ends_with(".self_attn.rotary_emb.inv_freq")) return true;
  return config.tie_word_embeddings && name == "lm_head.weight";
}

Result<ModelWeights> Bind(const Config& config, const std::map<std::string, TensorView>& tensors,
                          std::string_view source) {
  Binder bind(tensors, source);
  ModelWeights w;
  const uint64_t hidden = config.hidden_size;
  // A causal LM's tensors are its base model's under "model.", beside the head; a base model
  // saved alone (Hugging Face's LlamaModel, Qwen2Model, Qwen3Model: what embedding models built
  // on them load) has them without the prefix, and no head.
  const std::string base = tensors.count("embed_tokens.weight") != 0 && tensors.count("model.embed_tokens.weight") == 0
                               ? ""
                               : "model.";
  w.embed = bind.Take(base + "embed_tokens.weight", config.vocab_size, hidden);
  for (uint32_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = fmt::format("{}layers.{}.", base, i);
    LayerWeights l;
    l.input_norm = bind.Take(p + "input_layernorm.weight", hidden);
    l.post_attention_norm = bind.Take(p + "post_attention_layernorm.weight", hidden);
    l.q = bind.Take(p + "self_attn.q_proj.weight", config.q_size(), hidden);
    l.k = bind.Take(p + "self_attn.k_proj.weight", config.kv_size(), hidden);
    l.v = bind.Take(p + "self_attn.v_proj.weight", config.kv_size(), hidden);
    l.o = bind.Take(p + "self_attn.o_proj.weight", hidden, config.q_size());
    if (config.attention_bias) {
      l.q_bias = bind.Take(p + "self_attn.q_proj.bias", config.q_size());
      l.k_bias = bind.Take(p + "self_attn.k_proj.bias", config.kv_size());
      l.v_bias = bind.Take(p + "self_attn.v_proj.bias", config.kv_size());
    }
    if (config.output_bias) l.o_bias = bind.Take(p + "self_attn.o_proj.bias", hidden);
    if (config.qk_norm) {
      l.q_norm = bind.Take(p + "self_attn.q_norm.weight", config.head_dim);
      l.k_norm = bind.Take(p + "self_attn.k_norm.weight", config.head_dim);
    }
    l.gate = bind.Take(p + "mlp.gate_proj.weight", config.intermediate_size, hidden);
    l.up = bind.Take(p + "mlp.up_proj.weight", config.intermediate_size, hidden);
    l.down = bind.Take(p + "mlp.down_proj.weight", hidden, config.intermediate_size);
    w.layers.push_back(l);
  }
  w.final_norm = bind.Take(base + "norm.weight", hidden);
  // A base model saved alone may have no head (untied): it embeds only, nothing reads lm_head, and
  // a generation is refused (the engine's OpenSequence). A causal LM's checkpoint must have its
  // head: one that lost it (a bad shard) is refused here, not registered as an embedder.
  if (config.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else if (tensors.count("lm_head.weight") != 0 || !base.empty()) {
    w.lm_head = bind.Take("lm_head.weight", config.vocab_size, hidden);
  }
  if (!bind.status().ok()) return bind.status();
  for (const auto& [name, tensor] : tensors) {
    if (bind.used().count(name) == 0 && !Ignorable(name, config)) {
      return Error(Code::kInvalidArgument,
                   "{}: tensor \"{}\" is not part of a {} model as its config describes it (is the config the "
                   "checkpoint's own?)",
                   source, name, ArchitectureName(config.architecture));
    }
  }
  w.bytes = bind.bytes();
  return w;
}

}  // namespace

void Widen(const uint8_t* data, DType dtype, uint64_t first, uint64_t count, float* out) {
  switch (dtype) {
    case DType::F32:
      std::memcpy(out, data + first * 4, count * 4);
      return;
    case DType::F16:
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, data + (first + i) * 2, 2);
        out[i] = safetensors::HalfToFloat(h);
      }
      return;
    default:  // BF16: BindWeights admits nothing else
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, data + (first + i) * 2, 2);
        out[i] = safetensors::BF16ToFloat(h);
      }
      return;
  }
}

std::vector<float> WidenAll(const Vector& v) {
  std::vector<float> out(v.size);
  if (v) Widen(v.data, v.dtype, 0, v.size, out.data());
  return out;
}

Result<ModelWeights> BindWeights(const Config& config, const std::map<std::string, TensorView>& tensors,
                                 std::string_view source) {
  Result<ModelWeights> weights = Bind(config, tensors, source);
  if (!weights.ok()) return ValidUtf8(weights.status());
  return weights;
}

}  // namespace warmpool::transformer
