#include "common/paths.h"

#include <limits.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

namespace warmpool {

std::string DefaultSocketPath() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') return std::string(runtime) + "/warmpool.sock";
  return "/tmp/warmpool-" + std::to_string(getuid()) + ".sock";
}

std::string NextToSelf(const std::string& name) {
  char buffer[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return name;
  buffer[n] = '\0';
  return (std::filesystem::path(buffer).parent_path() / name).string();
}

}  // namespace warmpool
