#include "common/paths.h"

#include <unistd.h>

#include <cstdlib>

namespace warmpool {

std::string DefaultSocketPath() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') return std::string(runtime) + "/warmpool.sock";
  return "/tmp/warmpool-" + std::to_string(getuid()) + ".sock";
}

}  // namespace warmpool
