// Random-initialised checkpoints of any shape, written as Hugging Face writes them (config.json,
// model.safetensors or shards with model.safetensors.index.json), for tests and benchmarks:
// `warmpool-mkmodel --arch llama|mistral|qwen2|qwen3 DIR ...`.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engines/safetensors.h"
#include "engines/transformer/config.h"

namespace warmpool::transformer {

struct RandomCheckpoint {
  Architecture architecture = Architecture::kLlama;
  uint32_t vocab_size = 256;
  uint32_t hidden_size = 64;
  uint32_t intermediate_size = 128;
  uint32_t num_hidden_layers = 2;
  uint32_t num_attention_heads = 4;
  uint32_t num_key_value_heads = 2;
  uint32_t head_dim = 0;  // 0: hidden_size / num_attention_heads (Qwen3 writes it either way)
  uint64_t max_position_embeddings = 2048;
  uint64_t sliding_window = 0;  // Mistral only; 0: none
  double rope_theta = 10000.0;
  RopeScaling rope_scaling{};
  bool tie_word_embeddings = false;
  // The base model alone, as Hugging Face saves LlamaModel, Qwen2Model or Qwen3Model (and embedding
  // models built on them): its tensors without the "model." prefix, no output head, and the base
  // class as its architecture. Such a model embeds only.
  bool base_model_only = false;
  bool attention_bias = false;  // Llama and Qwen3 (Qwen2 always has q, k and v biases)
  safetensors::DType dtype = safetensors::DType::F32;
  uint32_t shards = 1;  // more than one: model-0000i-of-0000n.safetensors and the index
  uint64_t seed = 0;
};

// Writes the checkpoint into `directory` (created if missing); the weights depend only on the spec.
// Each file is written beside its name and renamed, so a crash never leaves half a file.
Status WriteRandomCheckpoint(const std::string& directory, const RandomCheckpoint& spec);

// The config.json text for the spec, as Hugging Face's configuration classes write the keys used.
std::string ConfigJson(const RandomCheckpoint& spec);

}  // namespace warmpool::transformer
