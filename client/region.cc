#include "client/region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace warmpool::client {

Result<SharedRegion> SharedRegion::Create(uint64_t bytes) {
  if (bytes == 0) return Error(Code::kInvalidArgument, "a region needs at least one byte");
  SharedRegion region;
  region.fd_ = memfd_create("warmpool-client-region", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (region.fd_ < 0) return Error(Code::kResourceExhausted, "memfd_create: {}", std::strerror(errno));
  if (ftruncate(region.fd_, static_cast<off_t>(bytes)) != 0 ||
      fcntl(region.fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Error(Code::kResourceExhausted, "cannot size and seal a region of {} bytes: {}", bytes,
                 std::strerror(errno));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, region.fd_, 0);
  if (p == MAP_FAILED) return Error(Code::kResourceExhausted, "cannot map a region of {} bytes: {}", bytes, std::strerror(errno));
  region.data_ = p;
  region.bytes_ = bytes;
  return region;
}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    this->~SharedRegion();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

SharedRegion::~SharedRegion() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

}  // namespace warmpool::client
