// A model directory as the transformer engine serves it: one weights region holding every tensor
// (as stored) and the tokenizer's file, and a description of that region — the model's "header"
// (engine.h) — holding the config and the small files beside it.
//
// The registry describes a directory when it registers it (the sizes admission needs, every check
// that needs no weights), a load reads it into the region, and an attach or an unpark opens the
// model from the description and the region alone: the directory is not read again, and may be
// gone. Parking the region therefore parks the tokenizer and the template with the weights.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engines/safetensors.h"
#include "engines/transformer/checkpoint.h"
#include "engines/transformer/config.h"
#include "engines/transformer/model_directory.h"

namespace warmpool::transformer {

// Tensors start at multiples of this in the region (cache lines; the GEMV kernels' loads).
inline constexpr uint64_t kRegionAlignment = 64;

struct PackedTensor {
  std::string name;
  safetensors::DType dtype = safetensors::DType::F32;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // in the region
  uint64_t bytes = 0;
  uint32_t file = 0;         // in PackedModel::files
  uint64_t file_offset = 0;  // where a load reads it
};

struct PackedModel {
  Config config;
  std::string config_text;  // config.json
  TextFiles texts;          // without the tokenizer's text, which lies in the region
  std::vector<std::string> files;     // the weights files, as the directory names them
  std::vector<PackedTensor> tensors;  // in region order
  uint64_t tokenizer_offset = 0;      // tokenizer.json in the region
  uint64_t tokenizer_bytes = 0;
  uint64_t region_bytes = 0;
};

// Reads the directory held open as `dir` (config.json, the weights files' headers, the tokenizer
// files) and checks all that can be checked without reading a weight: the config is supported,
// the tensors are the ones it needs, the tokenizer parses and fits the vocabulary. `shown` names
// the directory in messages; `tokenizer`, when given, gets tokenizer.json's text.
Result<PackedModel> DescribeDirectory(int dir, const std::string& shown, std::string* tokenizer = nullptr);

// The description as bytes (deterministic: the same directory gives the same bytes), and back.
// Decoding checks that it is one (the layout lies within the region, the config parses).
std::string EncodeHeader(const PackedModel& model);
Result<PackedModel> DecodeHeader(std::string_view header);
// Whether bytes are an encoded description (and not, say, a safetensors header).
bool IsPackedHeader(std::string_view header);

// Whether the model has an output head: its embeddings tied, or lm_head.weight. A base model saved
// alone (weights.h) may have none: it embeds only. Known from the description, before any load.
bool HasOutputHead(const PackedModel& model);

// The element of the KV cache the engine keeps for this model where it runs, in device memory or not
// (ChooseKvElement, by its key and value projections' dtype): registration counts a position's bytes
// by it before any worker has loaded the model, as the engine will.
KvElement ServedKvElement(const PackedModel& model, bool on_device);
// The workspace the engine reports where it runs (`config.kv_element` chosen): on the CPU
// WorkspaceBytes; in device memory the GPU's plan (PlanGpu: its KV pool, the activations of its
// rows, the kernels' scratch). What admission counts beside the weights, at registration as after
// the worker's load report.
uint64_t ServedWorkspaceBytes(const Config& config, uint32_t context, uint32_t sequences, uint64_t kv_tokens,
                              bool on_device);

// The model's KV caches and activations for `sequences` generations of `context` tokens each (their
// caches sharing `kv_tokens` positions, when not 0: KvPoolBlocks), in bytes: what the engine
// reports as its workspace, and admission counts beside the weights.
uint64_t WorkspaceBytes(const Config& config, uint32_t context, uint32_t sequences = 1, uint64_t kv_tokens = 0);
// Generations the CPU steps together, each with a KV cache of the whole context: `asked` (0: a
// default), at least 1 and at most kMaxSequences.
inline constexpr uint32_t kDefaultSequences = 4;
inline constexpr uint32_t kMaxSequences = 64;
inline uint32_t ServedSequences(uint32_t asked) {
  return asked == 0 ? kDefaultSequences : (asked > kMaxSequences ? kMaxSequences : asked);
}
// The context the engine serves: `asked` (0: a default), never past what the model was trained for.
uint32_t ServedContext(const Config& config, uint32_t asked);

}  // namespace warmpool::transformer
