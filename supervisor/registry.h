// Which models exist: [[models]] from the config, then every *.safetensors file in the models
// directory, registered by file stem. Reading a model's safetensors header gives the weight bytes
// that admission needs; the weights themselves are only ever read by a worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"
#include "supervisor/core/model_entry.h"

namespace warmpool::supervisor {

// Inspects one model (header only). Never fails: problems land in entry.problem. An engine that is
// not built in must be <engine_dir>/<engine>.so and pass CheckEngine (engines/plugin_loader.h); it is
// never loaded here.
ModelEntry InspectModel(const std::string& name, const std::string& engine, const std::string& path,
                        const std::string& engine_dir = {});
// The engine a model file names in its metadata ("engine"), else "dense" (also when the header
// cannot be read: InspectModel then says why).
std::string EngineNamedBy(const std::string& path);
// Config models first; a file whose stem matches a configured name is skipped with a warning.
std::vector<ModelEntry> DiscoverModels(const Config& config, std::vector<std::string>& warnings);

}  // namespace warmpool::supervisor
