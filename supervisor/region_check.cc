#include "supervisor/region_check.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

namespace warmpool::supervisor {

Status CheckClientRegion(int fd, uint64_t bytes) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return Error(Code::kInvalidArgument,
                 "a region must be a memfd (memfd_create with MFD_ALLOW_SEALING): F_GET_SEALS "
                 "says {}",
                 std::strerror(errno));
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return Error(Code::kInvalidArgument,
                 "a region's memfd must be sealed against shrinking (fcntl F_ADD_SEALS "
                 "F_SEAL_SHRINK) so that it cannot end under a worker that maps it");
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return Error(Code::kInvalidArgument,
                 "a region's memfd must stay writable (outputs are written into it): it is sealed "
                 "against writes");
  }
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    return Error(Code::kInvalidArgument, "cannot look at the region's memfd: {}", std::strerror(errno));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return Error(Code::kInvalidArgument, "the region says {} bytes but its memfd holds {}", bytes,
                 st.st_size);
  }
  return OkStatus();
}

}  // namespace warmpool::supervisor
