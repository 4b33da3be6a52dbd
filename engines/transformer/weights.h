// The tensors a decoder computes with, bound by their Hugging Face names and checked against the
// config: every tensor the architecture needs is there with its shape, in f32, f16 or bf16 (each
// used as stored), and nothing is left over that would change what the model computes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "engines/safetensors.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/config.h"

namespace warmpool::transformer {

// [rows, cols] row-major: a projection's weight is [out, in] as PyTorch's Linear stores it.
struct Matrix {
  safetensors::DType dtype = safetensors::DType::F32;
  uint32_t rows = 0;
  uint32_t cols = 0;
  const uint8_t* data = nullptr;
};

struct Vector {
  safetensors::DType dtype = safetensors::DType::F32;
  uint32_t size = 0;
  const uint8_t* data = nullptr;  // nullptr: absent (no bias)
  explicit operator bool() const { return data != nullptr; }
};

struct LayerWeights {
  Vector input_norm, post_attention_norm;
  Matrix q, k, v, o;
  Vector q_bias, k_bias, v_bias, o_bias;  // Qwen2 (q, k, v), Llama's attention_bias (all four)
  Vector q_norm, k_norm;                  // Qwen3: [head_dim] each
  Matrix gate, up, down;
};

struct ModelWeights {
  Matrix embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  Vector final_norm;
  // [vocab, hidden]; the embedding itself when tied. Data null: a base model saved alone (its
  // tensors without the "model." prefix, as embedding models ship) without lm_head.weight, which
  // embeds only.
  Matrix lm_head;
  uint64_t bytes = 0;
};

// count elements of a stored tensor (f32, f16 or bf16) from element `first` on, as f32.
void Widen(const uint8_t* data, safetensors::DType dtype, uint64_t first, uint64_t count, float* out);
// A whole vector as f32 (empty for an absent one).
std::vector<float> WidenAll(const Vector& v);

// tensors: by name, as in the checkpoint (Checkpoint::tensors()).
Result<ModelWeights> BindWeights(const Config& config, const std::map<std::string, TensorView>& tensors,
                                 std::string_view source);

}  // namespace warmpool::transformer
