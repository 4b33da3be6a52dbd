// Where model files may come from, and the one way the daemon opens them. A model path is accepted
// only when its real path (every symlink and `..` resolved) lies inside one of the model roots and
// names a regular file or a directory (a model directory's files are opened beneath it): a path
// from a client or a symlink in the models directory cannot make the daemon read /etc/shadow, a
// FIFO or a device.
//
// Checking a path and then opening it is a race: a directory on the way can be swapped for a
// symlink to anywhere in between (or at any time between registration and a load). So the roots
// are held as directory descriptors, and a file is opened *beneath* its root's descriptor with no
// symlink followed at all (openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a walk of
// O_NOFOLLOW opens where the kernel lacks openat2): a path that changed since it was resolved fails
// to open instead of leading out. Workers never resolve a path: the supervisor hands them the open
// file (the load's first descriptor), and they read the model through it.
#pragma once

#include <string>
#include <vector>

#include "common/file_version.h"
#include "common/status.h"
#include "supervisor/config.h"

namespace warmpool::supervisor {

// [access] model_roots, or when none is configured: the models directory and the directory of
// the config file.
std::vector<std::string> EffectiveModelRoots(const Config& config);

// A model file, open for reading. Owns its descriptor.
class ModelFile {
 public:
  ModelFile() = default;
  ModelFile(int fd, std::string path, FileVersion version);
  ModelFile(ModelFile&& other) noexcept;
  ModelFile& operator=(ModelFile&& other) noexcept;
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;
  ~ModelFile();

  int fd() const { return fd_; }
  // The real path it was opened at (for messages and the registry).
  const std::string& path() const { return path_; }
  // fstat of the open file, taken when it was opened; of a directory, DirectoryVersion's fold.
  const FileVersion& version() const { return version_; }
  bool is_directory() const;
  // Hands the descriptor over (to a frame that carries it); the caller closes it.
  int Release();

 private:
  int fd_ = -1;
  std::string path_;
  FileVersion version_;
};

class ModelRoots {
 public:
  ModelRoots() = default;
  // Opens every root that exists as a directory descriptor; one that does not exist holds nothing.
  explicit ModelRoots(const std::vector<std::string>& roots);
  ModelRoots(ModelRoots&& other) noexcept;
  ModelRoots& operator=(ModelRoots&& other) noexcept;
  ModelRoots(const ModelRoots&) = delete;
  ModelRoots& operator=(const ModelRoots&) = delete;
  ~ModelRoots();

  // The real path of `path` when it is under one of the roots: NOT_FOUND when it does not exist,
  // PERMISSION_DENIED when it resolves outside every root. Nothing is opened: use Open.
  Result<std::string> Resolve(const std::string& path) const;
  // Opens `real` (a path Resolve returned, now or at registration) beneath its root, following no
  // symlink: PERMISSION_DENIED when a part of it is a symlink now or it is outside every root,
  // NOT_FOUND when it is gone, INVALID_ARGUMENT when it is neither a regular file nor a directory.
  Result<ModelFile> OpenResolved(const std::string& real) const;
  // Resolve, then OpenResolved.
  Result<ModelFile> Open(const std::string& path) const;

 private:
  struct Root {
    std::string path;  // real path
    int fd = -1;       // O_PATH | O_DIRECTORY
  };
  void CloseAll();
  std::vector<Root> roots_;
};

// Opens `relative` (no leading '/', no "." or ".." parts) beneath the directory `dir` for reading,
// following no symlink. With `use_openat2` false, only the component-by-component walk (what
// kernels before 5.6 get); a test runs both. Returns the descriptor or -errno.
int OpenBeneath(int dir, const std::string& relative, bool use_openat2 = true);

}  // namespace warmpool::supervisor
