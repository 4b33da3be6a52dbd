#include "supervisor/model_roots.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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

}  // namespace

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

Result<std::string> ResolveModelPath(const std::string& path,
                                     const std::vector<std::string>& roots) {
  int err = 0;
  std::string real = RealPath(path, &err);
  if (real.empty()) {
    return Error(err == ENOENT ? Code::kNotFound : Code::kInvalidArgument,
                 "model file \"{}\" cannot be resolved: {}", path, std::strerror(err));
  }
  struct stat st{};
  if (stat(real.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Error(Code::kInvalidArgument, "model path \"{}\" ({}) is not a regular file", path, real);
  }
  std::string tried;
  for (const std::string& root : roots) {
    std::string real_root = RealPath(root, &err);
    if (real_root.empty()) continue;  // a root that does not exist holds nothing
    if (real_root == "/" || real.compare(0, real_root.size() + 1, real_root + "/") == 0) return real;
    tried += (tried.empty() ? "" : ", ") + real_root;
  }
  return Error(Code::kPermissionDenied,
               "model path \"{}\" resolves to {}, outside the model roots ({}): put the file under "
               "one of them or add its directory to [access] model_roots",
               path, real, tried.empty() ? "none exists" : tried);
}

}  // namespace warmpool::supervisor
