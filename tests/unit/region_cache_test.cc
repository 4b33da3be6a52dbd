// The host backend's cache of freed device memory (supervisor/region_cache.h) and the reuse of a
// kept region by HostMemory (devmem/host_memory.h).
#include "supervisor/region_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "tests/unit/vm_flags.h"

namespace warmpool::supervisor {
namespace {

int Memfd(uint64_t bytes, unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING) {
  int fd = memfd_create("region_cache_test", flags);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

struct stat StatOf(int fd) {
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  return st;
}

uint64_t SizeOf(int fd) { return static_cast<uint64_t>(StatOf(fd).st_size); }
uint64_t InodeOf(int fd) { return static_cast<uint64_t>(StatOf(fd).st_ino); }

// A region's mappings ask for 2 MiB pages (common/huge_pages.h): the one its weights are written
// through and a replica's read-only one, before their pages are touched. Whether the system gives
// them is its setting; the asking shows in the mappings' flags either way.
TEST(HostMemoryTest, TheMappingsOfARegionAskForHugePages) {
  if (!warmpool::testing::HugePageAdviceShows()) GTEST_SKIP() << "this kernel shows no huge page advice";
  HostMemory memory;
  Result<HostRegion> region = memory.Allocate(4 << 20, "huge_pages_test");
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  EXPECT_NE(warmpool::testing::VmFlagsOf(region->ptr).find(" hg "), std::string::npos)
      << warmpool::testing::VmFlagsOf(region->ptr);
  // Populated on one thread, or from several.
  for (uint64_t bytes : {uint64_t{4} << 20, HostMemory::kParallelPopulateBytes}) {
    Result<HostRegion> weights = memory.Allocate(bytes, "huge_pages_test");
    ASSERT_TRUE(weights.ok());
    Result<HostRegion> replica = memory.Import(weights->fd, bytes, /*read_only=*/true);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    EXPECT_NE(warmpool::testing::VmFlagsOf(replica->ptr).find(" hg "), std::string::npos) << bytes;
    memory.Free(*replica);
    memory.Free(*weights);
  }
  memory.Free(*region);
}

TEST(RegionCache, OffersOnlyMemoryThatCanBeResizedAndClosesAnythingElse) {
  RegionCache cache;
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  int sealed = Memfd(4096);
  ASSERT_EQ(fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  int empty = Memfd(0);
  int parked = Memfd(8192, MFD_CLOEXEC);  // without sealing (a parked copy): F_SEAL_SEAL only
  for (int fd : {pipe_fds[0], sealed, empty, parked}) cache.Keep(fd);
  cache.Keep(-1);
  EXPECT_EQ(cache.size(), 4u);
  std::vector<uint64_t> gone;
  EXPECT_EQ(cache.Take(pipe_fds[0], 4096, gone), -1) << "a pipe is not memory";
  EXPECT_FALSE(IsOpen(pipe_fds[0]));
  close(pipe_fds[1]);
  EXPECT_EQ(cache.Take(sealed, 4096, gone), -1) << "a region sealed against resizing cannot be reused";
  EXPECT_FALSE(IsOpen(sealed));
  EXPECT_EQ(cache.Take(empty, 4096, gone), -1);
  EXPECT_FALSE(IsOpen(empty));
  EXPECT_EQ(gone.size(), 3u) << "each closed one is named to the workers";
  EXPECT_EQ(cache.Take(parked, 4096, gone), parked);
  EXPECT_EQ(SizeOf(parked), 4096u) << "shrunk to what the job allocates";
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.Take(parked, 4096, gone), -1) << "taken already";
  EXPECT_TRUE(IsOpen(parked)) << "what it does not hold it never closes";
  close(parked);
}

TEST(RegionCache, DropClosesOnlyWhatItHoldsAndTheRestGoesWithIt) {
  int first = Memfd(4096), second = Memfd(4096), stranger = Memfd(4096);
  const uint64_t first_inode = InodeOf(first);
  {
    RegionCache cache;
    cache.Keep(first);
    cache.Keep(second);
    EXPECT_EQ(cache.Drop(first), first_inode);
    EXPECT_FALSE(IsOpen(first));
    EXPECT_EQ(cache.Drop(stranger), std::nullopt);
    EXPECT_TRUE(IsOpen(stranger));
    EXPECT_TRUE(IsOpen(second));
  }
  EXPECT_FALSE(IsOpen(second));
  close(stranger);
}

TEST(HostMemoryReuse, AResizedRegionKeepsItsPagesAndCountsAgainstTheBudget) {
  HostMemory memory(1 << 20);
  int fd = Memfd(65536);
  void* old = mmap(nullptr, 65536, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(old, MAP_FAILED);
  std::memset(old, 0x5a, 65536);
  munmap(old, 65536);
  Result<HostRegion> reused = memory.AllocateReusing(fd, 4096);
  ASSERT_TRUE(reused.ok()) << reused.status().ToString();
  EXPECT_EQ(reused->fd, fd);
  EXPECT_EQ(SizeOf(fd), 4096u) << "shrunk: the tail's pages go back";
  EXPECT_EQ(static_cast<uint8_t*>(reused->ptr)[4095], 0x5a) << "the same pages, not fresh ones";
  EXPECT_EQ(memory.used_bytes(), 4096u);
  memory.Free(*reused);
  EXPECT_EQ(memory.used_bytes(), 0u);

  int over = Memfd(4096);
  Result<HostRegion> refused = memory.AllocateReusing(over, 2 << 20);
  EXPECT_EQ(refused.status().code(), Code::kResourceExhausted);
  EXPECT_FALSE(IsOpen(over)) << "taken over even when refused";
  EXPECT_EQ(memory.used_bytes(), 0u);
}

// A region handed to the supervisor keeps its mapping when freed; the next offer of the same
// memory (the supervisor's descriptor of it) maps nothing anew, shrunk or grown, and what the
// supervisor closed is unmapped. A region never handed over is unmapped at once.
TEST(HostMemoryReuse, AHandedOverRegionKeepsItsMappingForTheNextOffer) {
  HostMemory memory;
  Result<HostRegion> weights = memory.Allocate(3 * 4096, "kept_test");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  std::memset(weights->ptr, 0x3c, 3 * 4096);
  void* const where = weights->ptr;
  const int supervisors = dup(weights->fd);  // what went to the supervisor with the load's reply
  memory.KeepMappingOf(weights->fd);
  memory.Free(*weights);
  EXPECT_EQ(memory.used_bytes(), 0u);
  EXPECT_EQ(memory.kept_mappings(), 1u);

  // Offered back shrunk to two pages: the same mapping, its tail unmapped.
  ASSERT_EQ(ftruncate(supervisors, 2 * 4096), 0);
  Result<HostRegion> shrunk = memory.AllocateReusing(dup(supervisors), 2 * 4096);
  ASSERT_TRUE(shrunk.ok()) << shrunk.status().ToString();
  EXPECT_EQ(shrunk->ptr, where);
  EXPECT_EQ(static_cast<uint8_t*>(shrunk->ptr)[2 * 4096 - 1], 0x3c);
  EXPECT_EQ(memory.kept_mappings(), 0u);
  memory.KeepMappingOf(shrunk->fd);
  memory.Free(*shrunk);

  // Then grown to four: the kept pages keep their contents, the new ones are zeros.
  Result<HostRegion> grown = memory.AllocateReusing(dup(supervisors), 4 * 4096);
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  EXPECT_EQ(SizeOf(grown->fd), 4u * 4096);
  EXPECT_EQ(static_cast<uint8_t*>(grown->ptr)[0], 0x3c);
  EXPECT_EQ(static_cast<uint8_t*>(grown->ptr)[4 * 4096 - 1], 0);
  static_cast<uint8_t*>(grown->ptr)[4 * 4096 - 1] = 1;  // writable to its end
  memory.KeepMappingOf(grown->fd);
  memory.Free(*grown);
  ASSERT_EQ(memory.kept_mappings(), 1u);

  // The supervisor closed it: the mapping goes.
  memory.ForgetMappings({InodeOf(supervisors)});
  EXPECT_EQ(memory.kept_mappings(), 0u);
  close(supervisors);

  // Never handed over (a load that failed): unmapped at once.
  Result<HostRegion> lost = memory.Allocate(4096, "kept_test");
  ASSERT_TRUE(lost.ok());
  memory.Free(*lost);
  EXPECT_EQ(memory.kept_mappings(), 0u);

  // At most kKeptMappings are kept, the oldest unmapped first.
  for (size_t i = 0; i < HostMemory::kKeptMappings + 2; ++i) {
    Result<HostRegion> r = memory.Allocate(4096, "kept_test");
    ASSERT_TRUE(r.ok());
    memory.KeepMappingOf(r->fd);
    memory.Free(*r);
  }
  EXPECT_EQ(memory.kept_mappings(), HostMemory::kKeptMappings);
}

// Weights another process wrote are mapped read-only: the service's write refuses them, and a
// stray store faults in the writer instead of changing them under every other replica.
TEST(HostMemoryImport, ImportedRegionsAreReadOnly) {
  HostMemory owner;
  Result<HostRegion> weights = owner.Allocate(8192, "import_test");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  std::memset(weights->ptr, 0x7e, 8192);
  HostMemory replica;
  const wp_device_memory* service = replica.service();
  wp_region imported{nullptr, 0, -1};
  ASSERT_EQ(service->import(service->ctx, weights->fd, 8192, &imported), WP_OK);
  EXPECT_EQ(static_cast<const uint8_t*>(imported.ptr)[8191], 0x7e);
  const uint8_t zeros[16] = {};
  EXPECT_EQ(service->write(service->ctx, &imported, 0, zeros, sizeof(zeros)), WP_INVALID_ARGUMENT);
  wp_region inside{static_cast<uint8_t*>(imported.ptr) + 4096, 4096, -1};
  EXPECT_EQ(service->write(service->ctx, &inside, 0, zeros, sizeof(zeros)), WP_INVALID_ARGUMENT) << "a part of it too";
  EXPECT_DEATH(static_cast<volatile uint8_t*>(imported.ptr)[0] = 0, "") << "mapped without PROT_WRITE";
  EXPECT_EQ(static_cast<const uint8_t*>(weights->ptr)[0], 0x7e);
  service->free(service->ctx, &imported);
  // A copy imported for a driver to pin is writable.
  HostMemory host;
  Result<HostRegion> pinnable = host.Import(weights->fd, 8192, /*read_only=*/false);
  ASSERT_TRUE(pinnable.ok()) << pinnable.status().ToString();
  EXPECT_FALSE(host.ReadOnly(pinnable->ptr));
  host.Free(*pinnable);
  // Its own allocations stay writable through the service.
  wp_region own{nullptr, 0, -1};
  ASSERT_EQ(service->alloc(service->ctx, 4096, &own), WP_OK);
  EXPECT_EQ(service->write(service->ctx, &own, 0, zeros, sizeof(zeros)), WP_OK);
  service->free(service->ctx, &own);
  owner.Free(*weights);
}

}  // namespace
}  // namespace warmpool::supervisor
