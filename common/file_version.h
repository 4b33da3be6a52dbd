// Which version of a file this is, as one definition for everything that asks "is it the same
// file?": registration, reload, load, park, warm-restart adoption and the kept manifest. Identity
// (device, inode) and content (size, modification and change times): a file replaced by rename has
// another inode; one rewritten in place has another change time, which the kernel sets on every
// write, even one that puts the modification time back (`cp -p`, `touch -r`). A retrained model of
// the same architecture has the same header and size, so those alone cannot tell it apart.
#pragma once

#include <cstdint>

struct stat;

namespace warmpool {

struct FileVersion {
  uint64_t size = 0;
  uint64_t mtime_ns = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  uint64_t ctime_ns = 0;
  bool operator==(const FileVersion&) const = default;
  // Zero: the file could not be looked at (missing, or a version reported by no one).
  bool known() const { return *this != FileVersion{}; }
};

FileVersion FileVersionOf(const struct stat& st);

// A model directory's version, over every file a model is made of in it (*.json and *.safetensors,
// and the *.json files of its sentence-transformers module folders, "1_Pooling/config.json"; not a
// README or a lock file written beside them, nor another subdirectory's files), so
// that any of them changed, replaced, added or removed changes it: sizes summed, the latest times,
// and an identity that mixes every file's name and version. Zero when `dir` is not a directory
// that can be read.
FileVersion DirectoryVersion(int dir);

}  // namespace warmpool
