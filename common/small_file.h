// The whole of a small file a user gives (a model's config.json, tokenizer.json), bounded: a path
// that is not a regular file, or a file larger than max_bytes — also one that grows past it while
// being read — is an error, never an allocation of whatever size the file claims.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace warmpool {

// Errors name the path: NOT_FOUND, PERMISSION_DENIED (from errno), INVALID_ARGUMENT (not a
// regular file, too large).
Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

}  // namespace warmpool
