#include "supervisor/model_roots.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

namespace warmpool::supervisor {

namespace {

std::string RealPath(const std::string& path, int* err) {
  char buffer[PATH_MAX];
  if (realpath(path.c_str(), buffer) == nullptr) {
    *err = errno;
    return "";
  }
  *err = 0;
  return buffer;
}

// O_NONBLOCK: a FIFO swapped in must not block the supervisor's loop in open (fstat refuses it).
constexpr int kOpenFlags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;

int Openat2Beneath(int dir, const std::string& relative) {
  open_how how{};
  how.flags = kOpenFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, dir, relative.c_str(), &how, sizeof(how));
  return fd >= 0 ? static_cast<int>(fd) : -errno;
}

// What openat2 does, for kernels without it: every directory opened with O_NOFOLLOW from the one
// before, so no component can be a symlink and `..` is refused outright.
int WalkBeneath(int dir, const std::string& relative) {
  int current = dir;
  auto close_current = [&] {
    if (current != dir) close(current);
  };
  size_t begin = 0;
  while (true) {
    size_t slash = relative.find('/', begin);
    std::string part = relative.substr(begin, slash == std::string::npos ? std::string::npos : slash - begin);
    if (part.empty() || part == "." || part == "..") {
      close_current();
      return -EXDEV;
    }
    const bool last = slash == std::string::npos;
    int next = openat(current, part.c_str(),
                      last ? kOpenFlags | O_NOFOLLOW : O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int err = errno;
    close_current();
    if (next < 0) return -err;
    current = next;
    if (last) return current;
    begin = slash + 1;
  }
}

}  // namespace

int OpenBeneath(int dir, const std::string& relative, bool use_openat2) {
  if (use_openat2) {
    int fd = Openat2Beneath(dir, relative);
    // ENOSYS: a kernel before 5.6; EPERM: a seccomp filter that does not know the call.
    if (fd != -ENOSYS && fd != -EPERM) return fd;
  }
  return WalkBeneath(dir, relative);
}

std::vector<std::string> EffectiveModelRoots(const Config& config) {
  if (!config.model_roots.empty()) return config.model_roots;
  std::vector<std::string> roots;
  if (!config.models_dir.empty()) roots.push_back(config.models_dir);
  if (!config.config_path.empty()) {
    std::string dir = std::filesystem::path(config.config_path).parent_path().string();
    roots.push_back(dir.empty() ? "." : dir);
  }
  return roots;
}

ModelFile::ModelFile(int fd, std::string path, FileVersion version)
    : fd_(fd), path_(std::move(path)), version_(version) {}

bool ModelFile::is_directory() const {
  struct stat st {};
  return fd_ >= 0 && fstat(fd_, &st) == 0 && S_ISDIR(st.st_mode);
}

ModelFile::ModelFile(ModelFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), version_(other.version_) {}

ModelFile& ModelFile::operator=(ModelFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    version_ = other.version_;
  }
  return *this;
}

ModelFile::~ModelFile() {
  if (fd_ >= 0) close(fd_);
}

int ModelFile::Release() { return std::exchange(fd_, -1); }

ModelRoots::ModelRoots(const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    int err = 0;
    std::string real = RealPath(root, &err);
    int fd = real.empty() ? -1 : open(real.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;  // a root that does not exist holds nothing
    roots_.push_back(Root{std::move(real), fd});
  }
}

ModelRoots::ModelRoots(ModelRoots&& other) noexcept
    : roots_(std::move(other.roots_)) {
  other.roots_.clear();
}

ModelRoots& ModelRoots::operator=(ModelRoots&& other) noexcept {
  if (this != &other) {
    CloseAll();
    roots_ = std::move(other.roots_);
    other.roots_.clear();
  }
  return *this;
}

ModelRoots::~ModelRoots() { CloseAll(); }

void ModelRoots::CloseAll() {
  for (Root& r : roots_) close(r.fd);
  roots_.clear();
}

Result<std::string> ModelRoots::Resolve(const std::string& path) const {
  int err = 0;
  std::string real = RealPath(path, &err);
  if (real.empty()) {
    return Error(err == ENOENT ? Code::kNotFound : Code::kInvalidArgument,
                 "model file \"{}\" cannot be resolved: {}", path, std::strerror(err));
  }
  std::string tried;
  for (const Root& root : roots_) {
    if (root.path == "/" || real.compare(0, root.path.size() + 1, root.path + "/") == 0) return real;
    tried += (tried.empty() ? "" : ", ") + root.path;
  }
  return Error(Code::kPermissionDenied,
               "model path \"{}\" resolves to {}, outside the model roots ({}): put the file under "
               "one of them or add its directory to [access] model_roots",
               path, real, tried.empty() ? "none exists" : tried);
}

Result<ModelFile> ModelRoots::OpenResolved(const std::string& real) const {
  const Root* root = nullptr;
  for (const Root& r : roots_) {
    if (r.path == "/" || real.compare(0, r.path.size() + 1, r.path + "/") == 0) {
      root = &r;
      break;
    }
  }
  if (root == nullptr) {
    return Error(Code::kPermissionDenied, "model file {} is outside the model roots now", real);
  }
  const std::string relative = real.substr(root->path == "/" ? 1 : root->path.size() + 1);
  int fd = OpenBeneath(root->fd, relative);
  if (fd < 0) {
    const int err = -fd;
    if (err == ENOENT) return Error(Code::kNotFound, "model file {} does not exist", real);
    if (err == ELOOP || err == EXDEV || err == ENOTDIR) {
      return Error(Code::kPermissionDenied,
                   "model file {} changed since its path was resolved: a part of it is a symlink "
                   "now, which may lead outside the model roots; reload (SIGHUP) or register the "
                   "model again to resolve it anew",
                   real);
    }
    // Out of descriptors or memory is the daemon's state, not the model's: RESOURCE_EXHAUSTED
    // fails the requests waiting without putting a healthy model into a failed cooldown.
    const Code code = err == EACCES                                      ? Code::kPermissionDenied
                      : err == EMFILE || err == ENFILE || err == ENOMEM ? Code::kResourceExhausted
                                                                          : Code::kInvalidArgument;
    return Error(code, "model file {} cannot be opened: {}", real, std::strerror(err));
  }
  ModelFile file(fd, real, {});
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    return Error(Code::kInternal, "model file {} cannot be looked at: {}", real, std::strerror(errno));
  }
  // A directory is a model too (a Hugging Face checkpoint): the engine reads the files in it
  // beneath this descriptor, following no symlink (common/small_file.h ReadSmallFileAt).
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
    return Error(Code::kInvalidArgument, "model path {} is neither a regular file nor a directory", real);
  }
  // Back to blocking reads: O_NONBLOCK was only for the open (it means nothing to a regular file,
  // but the worker inherits the file description).
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return ModelFile(file.Release(), real, S_ISDIR(st.st_mode) ? DirectoryVersion(fd) : FileVersionOf(st));
}

Result<ModelFile> ModelRoots::Open(const std::string& path) const {
  Result<std::string> real = Resolve(path);
  if (!real.ok()) return real.status();
  return OpenResolved(*real);
}

}  // namespace warmpool::supervisor
