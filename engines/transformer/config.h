// The shape of a Hugging Face decoder checkpoint, from its config.json: the Llama family (Llama
// 2/3/3.1/3.2, Mistral, SmolLM, TinyLlama), Qwen2/2.5 and Qwen3. They share one architecture:
//
//   x = embed[token]
//   per layer:  h = x + o_proj(attention(rope(q_norm?(q_proj(rms(x)))), rope(k_norm?(k_proj(rms(x)))), v_proj(rms(x))))
//               x = h + down_proj(silu(gate_proj(rms(h))) * up_proj(rms(h)))
//   logits = lm_head(rms(x))            (lm_head = embed when the embeddings are tied)
//
// with RMSNorm, rotary position embeddings on the halves of each head (HF's rotate_half), causal
// grouped-query attention, and these differences, each a field here: Qwen2 has biases on q, k and
// v; Qwen3 normalises each query and key head (q_norm, k_norm) before the rotation; Llama 3.1+
// stretches the rotary frequencies (rope_scaling "llama3"); Mistral may declare a sliding window.
//
// What this engine does not compute is refused here, naming the key and what it would need: a
// model that loads computes what its config says.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace warmpool::transformer {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };
std::string_view ArchitectureName(Architecture architecture);  // the config's model_type

// rope_scaling: absent ("default"), "linear" (positions divided by factor) or "llama3".
struct RopeScaling {
  enum class Kind { kNone, kLinear, kLlama3 } kind = Kind::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                       // llama3
  double high_freq_factor = 4.0;                      // llama3
  uint64_t original_max_position_embeddings = 8192;  // llama3
};

// How the KV cache stores a key's or a value's element: f32, or bf16 (where the weights are bf16
// and the CPU has the kernels: ChooseKvElement in decode_attention.h), which halves the
// bytes a position takes and the bytes a decode step's attention reads.
enum class KvElement : uint8_t { kF32, kBF16 };
inline constexpr uint32_t KvElementBytes(KvElement e) { return e == KvElement::kBF16 ? 2 : 4; }

struct Config {
  Architecture architecture = Architecture::kLlama;
  uint32_t vocab_size = 0;
  uint32_t hidden_size = 0;
  uint32_t intermediate_size = 0;
  uint32_t num_hidden_layers = 0;
  uint32_t num_attention_heads = 0;
  uint32_t num_key_value_heads = 0;  // grouped-query attention: heads share a key/value head
  uint32_t head_dim = 0;             // hidden_size / num_attention_heads unless the config says
  uint64_t max_position_embeddings = 0;
  uint64_t sliding_window = 0;       // 0: none (attention over the whole context)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // biases on q, k and v (and o for Llama's attention_bias)
  bool output_bias = false;     // a bias on o_proj too (Llama's attention_bias; Qwen2 has none)
  bool qk_norm = false;         // Qwen3's per-head RMSNorm of queries and keys
  // Not config.json's: the engine chooses it where the model runs (ChooseKvElement).
  KvElement kv_element = KvElement::kF32;

  // At most kMaxWidth each (Parse checks): the products fit in 32 bits.
  uint32_t q_size() const { return num_attention_heads * head_dim; }
  uint32_t kv_size() const { return num_key_value_heads * head_dim; }
  // The KV cache one token takes: a key and a value per key/value head per layer.
  uint64_t KvBytesPerToken() const { return uint64_t{2} * num_hidden_layers * kv_size() * KvElementBytes(kv_element); }

  // head_dim / 2 rotary frequencies, theta^(-2i/d), with rope_scaling applied (Hugging Face's rope
  // initialisations): what the CPU and the GPU both rotate by.
  std::vector<double> RotaryFrequencies() const;

  // config.json's text; `source` names it in errors, which are valid UTF-8 whatever the file holds.
  static Result<Config> Parse(std::string_view json_text, std::string_view source);

 private:
  static Result<Config> ParseJson(std::string_view json_text, std::string_view source);
};

}  // namespace warmpool::transformer
