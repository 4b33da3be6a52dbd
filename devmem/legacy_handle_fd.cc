#include "devmem/legacy_handle_fd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace warmpool {

// The memfd holds the 64 handle bytes, then the size in the host's byte order.
Result<int> LegacyHandleToFd(const std::string& handle, uint64_t bytes) {
  if (handle.size() != kLegacyHandleBytes) {
    return Error(Code::kInvalidArgument, "a CUDA IPC handle has {} bytes, not {}", kLegacyHandleBytes, handle.size());
  }
  int fd = memfd_create("warmpool-cuda-ipc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Error(Code::kInternal, "memfd_create: {}", std::strerror(errno));
  std::string contents = handle;
  contents.append(reinterpret_cast<const char*>(&bytes), sizeof bytes);
  if (pwrite(fd, contents.data(), contents.size(), 0) != static_cast<ssize_t>(contents.size()) ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    int err = errno;
    close(fd);
    return Error(Code::kInternal, "cannot write a CUDA IPC handle to a memfd: {}", std::strerror(err));
  }
  return fd;
}

Result<std::string> LegacyHandleFromFd(int fd) {
  std::string contents(kLegacyHandleBytes + sizeof(uint64_t), '\0');
  if (pread(fd, contents.data(), contents.size(), 0) != static_cast<ssize_t>(contents.size())) {
    return Error(Code::kInvalidArgument, "descriptor {} does not hold a CUDA IPC handle", fd);
  }
  return contents.substr(0, kLegacyHandleBytes);
}

}  // namespace warmpool
