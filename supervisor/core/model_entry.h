// A model as the registry found it: what its file's header says, before any worker reads it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/file_version.h"
#include "common/status.h"
#include "ipc/weights.pb.h"

namespace warmpool::supervisor {

// What a model's weights are: as its file's header says (a registration) or as the worker that
// read them said (a resident model's weights, a kept copy). The core's side of v1::ModelWeights
// (ipc/weights.proto), which the load reply, the attach and the restart manifest carry.
struct WeightsDescription {
  std::string header;  // raw header bytes (length prefix included), for attaching later
  uint64_t file_size = 0;
  FileVersion version;  // of the file as it was looked at or read (zero when nobody could say)
  uint64_t weight_bytes = 0;
  uint64_t workspace_bytes = 0;  // per replica; the engine's preflight estimate from the header
  uint32_t in_features = 0;
  uint32_t out_features = 0;
  // Language models: tokens of context per sequence, the KV cache per token (workspace_bytes
  // counts the cache of the whole context). 0 for other models.
  uint32_t context = 0;
  uint64_t kv_bytes_per_token = 0;
  uint32_t embedding_size = 0;  // floats per embedding: an embed reply's size
  // A language model that embeds but does not generate (no output head): generate is refused.
  bool embeds_only = false;
  // Generations its engine runs at once, each with a cache of the whole context (workspace_bytes
  // counts them all); 0: one at a time.
  uint32_t sequences = 0;
  // Positions its KV cache holds in all, shared by those generations (workspace_bytes counts
  // them); 0: each generation's whole context.
  uint64_t kv_tokens = 0;
  // Language models: how far a step carrying prompt tokens may stretch the decoding streams' (in
  // decode steps; [[models]] prefill_stretch, passed to the engine); 0: the engine's default.
  float prefill_stretch = 0;
  uint64_t KvCacheTokens() const { return kv_tokens != 0 ? kv_tokens : uint64_t{sequences > 0 ? sequences : 1} * context; }
  // Typed tensors its engine runs (no data; empty with runs_tensors: any), as a worker reported.
  bool runs_tensors = false;
  std::vector<v1::NamedTensor> inputs, outputs;
  bool generates() const { return context != 0; }
};

// The one conversion each way between the wire and the core. An absent file_version is a zero one.
WeightsDescription FromWire(const v1::ModelWeights& wire);
void ToWire(const WeightsDescription& description, v1::ModelWeights* wire);

// The registration's description is its base: a registered file that changed is followed by
// assigning the new description to it (static_cast<WeightsDescription&>(entry) = now).
struct ModelEntry : WeightsDescription {
  std::string name;
  std::string engine;
  std::string path;
  // The path names nothing (ENOENT): besides `problem`, what lets a warm restart keep serving the
  // weights it holds of a file deleted since, as the daemon before it did.
  bool file_missing = false;
  Status problem;  // not ok: the model is registered as failed with this reason
  // The problem is the file's contents or its absence (a header that does not parse, layers that
  // do not chain, no such file): fixing the file is what helps. Not so for an engine that is not
  // installed or a file configured for another engine: those are the configuration's.
  bool problem_in_file = false;
  // The path is refused (outside the model roots, not a regular file): no worker may open it,
  // not even to retry after a cooldown. Other problems are retried like failed loads.
  bool path_refused = false;
  // Found in the models directory (its file name is its name), not listed in the configuration:
  // what owns it, for the messages that say where to change it.
  bool from_models_dir = false;
  // A language model: the format its calls of tools are written in, as its chat template shows
  // ("hermes", "llama3_json"; "" none).
  std::string tool_call_format;
};

// Names are 1..63 bytes of [A-Za-z0-9._-], not starting with '.'.
Status CheckModelName(const std::string& name);

}  // namespace warmpool::supervisor
