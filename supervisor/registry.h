// Which models exist: [[models]] from the config, then every *.safetensors file in the models
// directory, registered by file stem. Reading a model's safetensors header gives the weight bytes
// that admission needs; the weights themselves are only ever read by a worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"

namespace warmpool::supervisor {

struct ModelEntry {
  std::string name;
  std::string engine;
  std::string path;
  uint64_t weight_bytes = 0;
  uint64_t workspace_bytes = 0;  // engine's preflight estimate, known from the header
  uint32_t in_features = 0;
  uint32_t out_features = 0;
  std::string header;       // raw header bytes (length prefix included), for attaching later
  uint64_t file_size = 0;
  Status problem;  // not ok: the model is registered as failed with this reason
  // The path is refused (outside the model roots, not a regular file): no worker may open it,
  // not even to retry after a cooldown. Other problems are retried like failed loads.
  bool path_refused = false;
};

// Names are 1..63 bytes of [A-Za-z0-9._-], not starting with '.'.
Status CheckModelName(const std::string& name);
// Inspects one model (header only). Never fails: problems land in entry.problem. An engine that is
// not built in must be <engine_dir>/<engine>.so and pass CheckEngine (engines/plugin_loader.h); it is
// never loaded here.
ModelEntry InspectModel(const std::string& name, const std::string& engine, const std::string& path,
                        const std::string& engine_dir = {});
// Config models first; a file whose stem matches a configured name is skipped with a warning.
std::vector<ModelEntry> DiscoverModels(const Config& config, std::vector<std::string>& warnings);

}  // namespace warmpool::supervisor
