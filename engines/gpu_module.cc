#include "engines/gpu_module.h"

#include <dlfcn.h>

#include <filesystem>
#include <map>
#include <utility>
#include <mutex>
#include <vector>

#include <fmt/format.h>

namespace warmpool {
namespace {

std::string RunningBinaryDir() {
  std::error_code error;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string() : exe.parent_path().string();
}

GpuModuleEntry OpenModule(const std::string& file, const std::string& symbol) {
  GpuModuleEntry module;
  const std::string dir = RunningBinaryDir();
  std::vector<std::string> candidates = {dir + "/" + file};
#ifdef WARMPOOL_GPU_MODULES_FROM_BINDIR
  candidates.push_back(dir + "/" WARMPOOL_GPU_MODULES_FROM_BINDIR "/" + file);
#endif
  std::string tried;
  for (const std::string& path : candidates) {
    std::error_code error;
    if (!std::filesystem::exists(path, error)) {
      tried += (tried.empty() ? "" : ", ") + path;
      continue;
    }
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      module.why = fmt::format("cannot load {}: {}", path, dlerror());
      return module;
    }
    module.entry = dlsym(handle, symbol.c_str());
    if (module.entry == nullptr) module.why = fmt::format("{} has no {}", path, symbol);
    return module;
  }
  module.why = fmt::format("no GPU kernels in this build ({} not found: {})", file, tried);
  return module;
}

}  // namespace

const GpuModuleEntry& LoadGpuModule(const std::string& file, const std::string& symbol) {
  static std::mutex mutex;
  // By file and symbol: one module has several entry points (dlopen counts the handles it gives
  // out, so each pair opening the file once keeps it loaded once). Never erased: references stay
  // valid.
  static std::map<std::pair<std::string, std::string>, GpuModuleEntry> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_pair(file, symbol);
  auto it = loaded.find(key);
  if (it == loaded.end()) it = loaded.emplace(key, OpenModule(file, symbol)).first;
  return it->second;
}

}  // namespace warmpool
