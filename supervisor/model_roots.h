// Where model files may come from. A model path is accepted only when its real path (every
// symlink and `..` resolved) lies inside one of the model roots and names a regular file: a path
// from a client or a symlink in the models directory cannot make the daemon read /etc/shadow, a
// FIFO or a device. The worker is handed the resolved path, never the one given.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"

namespace warmpool::supervisor {

// [access] model_roots, or when none is configured: the models directory and the directory of
// the config file.
std::vector<std::string> EffectiveModelRoots(const Config& config);

// The real path of `path` when it is a regular file under one of `roots`; NOT_FOUND when it does
// not exist, INVALID_ARGUMENT when it is not a regular file, PERMISSION_DENIED when it resolves
// outside every root.
Result<std::string> ResolveModelPath(const std::string& path, const std::vector<std::string>& roots);

}  // namespace warmpool::supervisor
