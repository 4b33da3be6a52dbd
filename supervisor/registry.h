// Which models exist: [[models]] from the config, then every *.safetensors file in the models
// directory, registered by file stem, and every directory in it holding a config.json (a Hugging
// Face model), registered by its name. Reading a model's headers gives the weight bytes that
// admission needs; the weights themselves are only ever read by a worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"
#include "supervisor/core/model_entry.h"
#include "supervisor/model_roots.h"

namespace warmpool::supervisor {

// Inspects one model (header only), opening its file beneath the model roots: a path that is
// refused (outside the roots, neither a regular file nor a directory) sets entry.path_refused. Never fails: problems
// land in entry.problem. `engine` empty: "transformer" for a model directory; for a file, the
// engine its metadata names ("engine"), else "dense". An engine that is not built in must be <engine_dir>/<engine>.so and pass CheckEngine
// (engines/catalog/plugin_loader.h); it is never loaded here. The entry's path is the resolved one, and
// its version is the open file's. `backend`: where the workers run a language model, which decides
// its KV cache's element and its workspace, as admission counts them (auto, not yet resolved, as
// `warmpoold --check` sees it, counts as a device: the cache in f32).
ModelEntry InspectModel(const std::string& name, const std::string& engine, const std::string& path,
                        const ModelRoots& roots, const std::string& engine_dir = {},
                        Backend backend = Backend::kAuto);
// Config models first; a file whose stem matches a configured name is skipped with a warning.
std::vector<ModelEntry> DiscoverModels(const Config& config, const ModelRoots& roots,
                                       std::vector<std::string>& warnings);

}  // namespace warmpool::supervisor
