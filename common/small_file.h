// The whole of a small file a user gives (a model's config.json, tokenizer.json), bounded: a path
// that is not a regular file, or a file larger than max_bytes — also one that grows past it while
// being read — is an error, never an allocation of whatever size the file claims.
#pragma once

#include <cstdint>
#include <string>

#include "common/file_version.h"
#include "common/status.h"

namespace warmpool {

// Errors name the path: NOT_FOUND, PERMISSION_DENIED (from errno), INVALID_ARGUMENT (not a
// regular file, too large).
Result<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);

// One file of a directory held open (`dir`), named by `name` (one path component): opened beneath
// it without following a symlink, so that a file inside a model directory cannot lead the reader
// out of it (a symlink is INVALID_ARGUMENT, saying so). `shown` names the file in messages. The
// file's version, when asked for, is of the very file read.
Result<std::string> ReadSmallFileAt(int dir, const std::string& name, uint64_t max_bytes, const std::string& shown,
                                    FileVersion* version = nullptr);
// The descriptor of `name` (one path component) in `dir`, opened for reading beneath it in the same
// way, checked to be a regular file. The caller closes it.
Result<int> OpenFileAt(int dir, const std::string& name, const std::string& shown);

}  // namespace warmpool
