// A client's shared-memory region: a memfd mapped here and registered with warmpoold
// (RegionRequest), so that large tensors travel as offsets and the daemon never copies them.
// The worker that runs a request reads its input from the region and writes its output there.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace warmpool::client {

class SharedRegion {
 public:
  // A memfd of `bytes`, sealed against shrinking and growing (the daemon requires the first: a
  // region that could shrink under a worker would kill it), mapped read-write here.
  static Result<SharedRegion> Create(uint64_t bytes);
  SharedRegion() = default;
  SharedRegion(SharedRegion&& other) noexcept { *this = std::move(other); }
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  ~SharedRegion();

  int fd() const { return fd_; }
  char* data() const { return static_cast<char*>(data_); }
  uint64_t bytes() const { return bytes_; }
  // The daemon's id once registered (Client::RegisterRegion), 0 before.
  uint64_t id() const { return id_; }
  void set_id(uint64_t id) { id_ = id; }

 private:
  int fd_ = -1;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t id_ = 0;
};

}  // namespace warmpool::client
