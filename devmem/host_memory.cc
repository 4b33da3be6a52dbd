#include "devmem/host_memory.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/chunks.h"
#include "common/huge_pages.h"

namespace warmpool {
namespace {

uint64_t Inode(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

uint64_t PageUp(uint64_t bytes) {
  static const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

// Page tables for a writable range made in one call (5.14+; elsewhere the pages fault in on use).
void PopulateForWrite(void* ptr, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  (void)madvise(ptr, bytes, MADV_POPULATE_WRITE);
#else
  (void)ptr;
  (void)bytes;
#endif
}

}  // namespace

Status HostMemory::Reserve(uint64_t bytes) {
  if (bytes == 0) return Error(Code::kInvalidArgument, "cannot allocate a region of 0 bytes");
  // Reserved before the region exists, so that two threads cannot both pass the budget check.
  uint64_t before = used_.fetch_add(bytes, std::memory_order_relaxed);
  if (budget_ != 0 && before + bytes > budget_) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return Error(Code::kResourceExhausted,
                 "device memory budget exhausted: {} bytes in use, {} requested, budget {}",
                 before, bytes, budget_);
  }
  return OkStatus();
}

Result<HostRegion> HostMemory::Allocate(uint64_t bytes, const char* label) {
  if (Status reserved = Reserve(bytes); !reserved.ok()) return reserved;
  int fd = memfd_create(label, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return Error(Code::kInternal, "memfd_create: {}", std::strerror(errno));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return Error(Code::kResourceExhausted, "cannot size a {}-byte region: {}", bytes,
                 std::strerror(err));
  }
  void* ptr = MapShared(fd, bytes, PROT_READ | PROT_WRITE);
  if (ptr == MAP_FAILED) {
    int err = errno;
    close(fd);
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return Error(Code::kResourceExhausted, "cannot map a {}-byte region: {}", bytes,
                 std::strerror(err));
  }
  MakeHugePages(ptr, bytes);  // while it is empty, before the load writes it (common/huge_pages.h)
  return HostRegion{ptr, bytes, fd};
}

Result<HostRegion> HostMemory::AllocateReusing(int fd, uint64_t bytes) {
  struct FdCloser {
    int fd;
    ~FdCloser() {
      if (fd >= 0) close(fd);
    }
  } closer{fd};
  if (Status reserved = Reserve(bytes); !reserved.ok()) return reserved;
  struct stat st {};
  // Shrinking gives the tail's pages back; growing adds fresh ones (faulted in by the populate).
  if (fstat(fd, &st) != 0 ||
      (static_cast<uint64_t>(st.st_size) != bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    int err = errno;
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return Error(Code::kInternal, "cannot resize a reused region to {} bytes: {}", bytes, std::strerror(err));
  }
  if (void* kept = ReuseKeptMapping(Inode(fd), bytes); kept != nullptr) {
    closer.fd = -1;
    return HostRegion{kept, bytes, fd};
  }
  // In 2 MiB pages (common/huge_pages.h): a region offered back is in them already where the
  // kernel granted them when it was made; what a growth adds is made so before it is populated.
  void* ptr = MapShared(fd, bytes, PROT_READ | PROT_WRITE);
  if (ptr == MAP_FAILED) {
    int err = errno;
    used_.fetch_sub(bytes, std::memory_order_relaxed);
    return Error(Code::kResourceExhausted, "cannot map a reused {}-byte region: {}", bytes, std::strerror(err));
  }
  MakeHugePages(ptr, bytes, /*reused=*/static_cast<uint64_t>(st.st_size));
  PopulateForWrite(ptr, bytes);
  closer.fd = -1;
  return HostRegion{ptr, bytes, fd};
}

void* HostMemory::ReuseKeptMapping(uint64_t inode, uint64_t bytes) {
  KeptMapping kept = TakeKeptMapping(inode);
  if (kept.ptr == nullptr) return nullptr;
  const uint64_t old_length = PageUp(kept.bytes), new_length = PageUp(bytes);
  if (new_length <= old_length) {
    // The region shrank (the supervisor truncated it to this job's size): the tail is gone.
    if (new_length < old_length) munmap(static_cast<uint8_t*>(kept.ptr) + new_length, old_length - new_length);
    return kept.ptr;
  }
  // It grew: the mapping keeps its page tables and gains the new pages, made 2 MiB ones
  // (common/huge_pages.h) and populated in one call each. Moved where 2 MiB pages cannot be mapped
  // whole, it goes, and the caller maps the region afresh.
  void* grown = mremap(kept.ptr, old_length, new_length, MREMAP_MAYMOVE);
  if (grown == MAP_FAILED) {
    munmap(kept.ptr, old_length);
    return nullptr;
  }
  if (reinterpret_cast<uintptr_t>(grown) % kHugePageBytes != 0) {
    munmap(grown, new_length);
    return nullptr;
  }
  MakeHugePages(grown, new_length, /*reused=*/old_length);
  PopulateForWrite(static_cast<uint8_t*>(grown) + old_length, new_length - old_length);
  return grown;
}

HostMemory::KeptMapping HostMemory::TakeKeptMapping(uint64_t inode) {
  std::lock_guard lock(kept_mutex_);
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->inode != inode) continue;
    KeptMapping found = *it;
    kept_.erase(it);
    return found;
  }
  return KeptMapping{};
}

void HostMemory::KeepMappingOf(int fd) {
  const uint64_t inode = Inode(fd);
  if (inode == 0) return;
  std::lock_guard lock(kept_mutex_);
  handed_over_.insert(inode);
}

void HostMemory::ForgetMappings(const std::vector<uint64_t>& inodes) {
  for (uint64_t inode : inodes) {
    KeptMapping kept = TakeKeptMapping(inode);
    if (kept.ptr != nullptr) munmap(kept.ptr, kept.bytes);
    std::lock_guard lock(kept_mutex_);
    handed_over_.erase(inode);
  }
}

size_t HostMemory::kept_mappings() {
  std::lock_guard lock(kept_mutex_);
  return kept_.size();
}

HostMemory::~HostMemory() {
  for (const KeptMapping& kept : kept_) munmap(kept.ptr, kept.bytes);
}

Result<int> HostMemory::CopyToHost(const wp_device_memory& device, const wp_region& region, int reuse_fd) {
  const uint64_t bytes = region.bytes;
  int fd = reuse_fd >= 0 ? reuse_fd : memfd_create("warmpool-parked", MFD_CLOEXEC);
  if (fd < 0) return Error(Code::kInternal, "memfd_create: {}", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 ||
      (static_cast<uint64_t>(st.st_size) != bytes && ftruncate(fd, static_cast<off_t>(bytes)) != 0)) {
    int err = errno;
    close(fd);
    return Error(Code::kResourceExhausted, "cannot size a {}-byte host copy: {}", bytes, std::strerror(err));
  }
  // A parked copy becomes an unparked model's region (AllocateReusing): its pages are made 2 MiB
  // ones before they are written (common/huge_pages.h).
  void* ptr = MapShared(fd, bytes, PROT_READ | PROT_WRITE);
  if (ptr == MAP_FAILED) {
    int err = errno;
    close(fd);
    return Error(Code::kResourceExhausted, "cannot map a {}-byte host copy: {}", bytes, std::strerror(err));
  }
  MakeHugePages(ptr, bytes, /*reused=*/static_cast<uint64_t>(st.st_size));
  if (reuse_fd >= 0) PopulateForWrite(ptr, bytes);
  // Host memory: a few threads at once; a GPU's copies are driven by its service in one call.
  const bool read = ForEachChunk(bytes, device.host_addressable != 0 ? kCopyChunkBytes : bytes, kCopyThreads,
                                 [&](uint64_t offset, uint64_t length) {
                                   return device.read(device.ctx, &region, offset,
                                                      static_cast<uint8_t*>(ptr) + offset, length) == WP_OK;
                                 });
  munmap(ptr, bytes);
  if (!read) {
    close(fd);
    return Error(Code::kInternal, "cannot copy {} bytes out of device memory", bytes);
  }
  return fd;
}

Result<int> HostMemory::CopyToSealedHost(const wp_device_memory& device, const wp_region& region) {
  const int fd = memfd_create("warmpool-parked-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Error(Code::kInternal, "memfd_create: {}", std::strerror(errno));
  Result<int> copied = CopyToHost(device, region, fd);  // closes fd on failure
  if (!copied.ok()) return copied.status();
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    close(fd);
    return Error(Code::kInternal, "cannot seal a host copy: {}", std::strerror(err));
  }
  return fd;
}

Result<HostRegion> HostMemory::Import(int fd, uint64_t bytes, bool read_only) {
  if (bytes == 0) return Error(Code::kInvalidArgument, "cannot import a region of 0 bytes");
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return Error(Code::kInvalidArgument, "shared region of {} bytes is smaller than the {} expected",
                 static_cast<uint64_t>(st.st_size), bytes);
  }
  // Memory this process kept mapped from before now holds another's weights: that writable
  // mapping goes (the import maps it read-only).
  if (KeptMapping kept = TakeKeptMapping(st.st_ino); kept.ptr != nullptr) munmap(kept.ptr, kept.bytes);
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return Error(Code::kInternal, "dup: {}", std::strerror(errno));
  // Read-only: weights another process wrote and others map too must not change under them (an
  // engine's stray write faults in its own worker instead of corrupting every replica). And
  // mapped with its page tables filled (the pages exist), so that the first request on a new
  // replica does not take a page fault per 4 KiB of weights. (A VM with shadow paging still
  // charges each page's first read, through a read-only mapping much less than a writable one.)
  // A writable mapping is for a driver that pins it (cuMemHostRegister wants one), which
  // populates it itself.
  //
  // The page tables of a large region are filled from a few threads at once (MADV_POPULATE_READ
  // per chunk; the kernel locks page tables per 2 MiB, so chunks do not contend): one thread fills
  // about 6 GiB/s of 4 KiB pages here, which is most of what attaching 1 GiB costs. Where the
  // kernel lacks MADV_POPULATE_READ (before 5.14), MAP_POPULATE does it on one thread.
  //
  // The mapping is aligned for 2 MiB pages and asks for them before it is populated
  // (common/huge_pages.h): where the region's pages are 2 MiB ones, it then maps each whole.
  const bool parallel = read_only && bytes >= kParallelPopulateBytes;
  void* ptr = MapShared(own, bytes, read_only ? PROT_READ : PROT_READ | PROT_WRITE);
  if (ptr == MAP_FAILED) {
    int err = errno;
    close(own);
    return Error(Code::kInternal, "cannot map a shared {}-byte region: {}", bytes, std::strerror(err));
  }
  if (read_only) {
    auto* base = static_cast<uint8_t*>(ptr);
    const bool populated = ForEachChunk(bytes, parallel ? kCopyChunkBytes : bytes, parallel ? kCopyThreads : 1,
                                        [&](uint64_t offset, uint64_t length) {
                                          return madvise(base + offset, length, MADV_POPULATE_READ) == 0;
                                        });
    if (!populated) {  // an old kernel: fill them on this thread
      munmap(ptr, bytes);
      ptr = MapShared(own, bytes, PROT_READ, MAP_POPULATE);
      if (ptr == MAP_FAILED) {
        int err = errno;
        close(own);
        return Error(Code::kInternal, "cannot map a shared {}-byte region: {}", bytes, std::strerror(err));
      }
    }
  }
  std::lock_guard lock(imported_mutex_);
  imported_[reinterpret_cast<uintptr_t>(ptr)] = ImportedMapping{bytes, read_only};
  return HostRegion{ptr, bytes, own};
}

bool HostMemory::ReadOnly(const void* ptr) {
  const auto at = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(imported_mutex_);
  auto it = imported_.upper_bound(at);  // the first mapping after it; the one before may hold it
  if (it == imported_.begin()) return false;
  --it;
  return at - it->first < it->second.bytes && it->second.read_only;
}

void HostMemory::Free(HostRegion& region) {
  bool imported = false;
  if (region.ptr != nullptr) {
    std::lock_guard lock(imported_mutex_);
    imported = imported_.erase(reinterpret_cast<uintptr_t>(region.ptr)) != 0;
  }
  // A region the supervisor holds keeps its mapping for the next offer of its memory; any other
  // is unmapped (memory nobody will name again must not stay mapped).
  const uint64_t inode = !imported && region.ptr != nullptr && region.fd >= 0 ? Inode(region.fd) : 0;
  bool kept = false;
  if (inode != 0) {
    std::lock_guard lock(kept_mutex_);
    if (handed_over_.erase(inode) != 0) {
      kept_.push_back(KeptMapping{inode, region.ptr, region.bytes});
      kept = true;
      if (kept_.size() > kKeptMappings) {
        munmap(kept_.front().ptr, kept_.front().bytes);
        kept_.pop_front();
      }
    }
  }
  if (region.ptr != nullptr && !kept) munmap(region.ptr, region.bytes);
  if (region.fd >= 0) close(region.fd);
  if (region.bytes != 0 && !imported) used_.fetch_sub(region.bytes, std::memory_order_relaxed);
  region = HostRegion{};
}

wp_status HostMemory::CAlloc(void* ctx, uint64_t bytes, wp_region* out) {
  auto* self = static_cast<HostMemory*>(ctx);
  Result<HostRegion> region = self->Allocate(bytes, "warmpool-weights");
  if (!region.ok()) {
    return region.status().code() == Code::kResourceExhausted ? WP_RESOURCE_EXHAUSTED : WP_INTERNAL;
  }
  *out = wp_region{region->ptr, region->bytes, region->fd};
  return WP_OK;
}

wp_status HostMemory::CImport(void* ctx, int handle, uint64_t bytes, wp_region* out) {
  Result<HostRegion> region = static_cast<HostMemory*>(ctx)->Import(handle, bytes);
  if (!region.ok()) {
    return region.status().code() == Code::kInvalidArgument ? WP_INVALID_ARGUMENT : WP_INTERNAL;
  }
  *out = wp_region{region->ptr, region->bytes, region->fd};
  return WP_OK;
}

wp_status HostMemory::CWrite(void* ctx, const wp_region* region, uint64_t offset, const void* source, uint64_t bytes) {
  if (region == nullptr || offset > region->bytes || bytes > region->bytes - offset) return WP_INVALID_ARGUMENT;
  if (static_cast<HostMemory*>(ctx)->ReadOnly(region->ptr)) return WP_INVALID_ARGUMENT;
  if (bytes != 0) std::memcpy(static_cast<uint8_t*>(region->ptr) + offset, source, bytes);
  return WP_OK;
}

wp_status HostMemory::CRead(void*, const wp_region* region, uint64_t offset, void* destination, uint64_t bytes) {
  if (region == nullptr || offset > region->bytes || bytes > region->bytes - offset) return WP_INVALID_ARGUMENT;
  if (bytes != 0) std::memcpy(destination, static_cast<const uint8_t*>(region->ptr) + offset, bytes);
  return WP_OK;
}

void HostMemory::CFree(void* ctx, wp_region* region) {
  if (region == nullptr) return;
  HostRegion host{region->ptr, region->bytes, region->handle};
  static_cast<HostMemory*>(ctx)->Free(host);
  *region = wp_region{nullptr, 0, -1};
}

}  // namespace warmpool
