// Weights in 2 MiB pages whatever the system's shared-memory setting (common/huge_pages.h): the
// mappings are aligned for them, and a region's writer makes its pages 2 MiB ones before it fills
// them, which every later mapping then maps whole.
#include "common/huge_pages.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "devmem/host_memory.h"
#include "tests/unit/vm_flags.h"

namespace warmpool {
namespace {

constexpr uint64_t kMiB = 1 << 20;

int Memfd(uint64_t bytes) {
  const int fd = memfd_create("huge_pages_test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  return fd;
}

// VmSize from /proc/self/status, read without allocating (the heap's growth would count).
uint64_t VmSizeKiB() {
  char text[4096] = {};
  const int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
  const ssize_t got = read(fd, text, sizeof(text) - 1);
  close(fd);
  const char* line = got > 0 ? std::strstr(text, "VmSize:") : nullptr;
  return line == nullptr ? 0 : std::strtoull(line + 7, nullptr, 10);
}

// How often the kernel found no free 2 MiB page for a collapse (/proc/vmstat), system-wide: a test
// that wanted some and got none skips instead of failing (the machine's memory, not the code).
uint64_t CollapseAllocFailures() {
  char text[16384] = {};
  const int fd = open("/proc/vmstat", O_RDONLY | O_CLOEXEC);
  const ssize_t got = fd < 0 ? 0 : read(fd, text, sizeof(text) - 1);
  if (fd >= 0) close(fd);
  const char* line = got > 0 ? std::strstr(text, "thp_collapse_alloc_failed ") : nullptr;
  return line == nullptr ? 0 : std::strtoull(line + std::strlen("thp_collapse_alloc_failed "), nullptr, 10);
}

#define SKIP_IF_NO_HUGE_PAGE_WAS_FREE(failures_before)                                        \
  if (CollapseAllocFailures() != (failures_before)) GTEST_SKIP() << "the kernel had no free 2 MiB page"

// Whether this kernel makes a writer's shared pages 2 MiB ones (Linux 6.1 and later, unless
// shmem_enabled is "deny"), and shows it.
bool HugePagesAreMade() {
  const int fd = Memfd(2 * kMiB);
  void* p = MapShared(fd, 2 * kMiB, PROT_READ | PROT_WRITE);
  const bool made = p != MAP_FAILED && MakeHugePages(p, 2 * kMiB) && testing::ShmemPmdMappedKiB(p) == 2048;
  if (p != MAP_FAILED) munmap(p, 2 * kMiB);
  close(fd);
  return made;
}

// A 2 MiB page is mapped whole only at an aligned address; the address space reserved to find one
// is given back, all but the mapping.
TEST(HugePagesTest, ASharedMappingOfAHugePageOrMoreIsAlignedAndNoLarger) {
  const uint64_t bytes = 6 * kMiB + 4096;  // not a whole number of huge pages
  const int fd = Memfd(bytes);
  const uint64_t before = VmSizeKiB();
  void* writer = MapShared(fd, bytes, PROT_READ | PROT_WRITE);
  const uint64_t after = VmSizeKiB();
  ASSERT_NE(writer, MAP_FAILED) << std::strerror(errno);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(writer) % kHugePageBytes, 0u);
  EXPECT_EQ(after - before, bytes / 1024) << "the reserved address space around it went back";
  void* reader = MapShared(fd, bytes, PROT_READ);
  ASSERT_NE(reader, MAP_FAILED);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(reader) % kHugePageBytes, 0u);
  static_cast<uint8_t*>(writer)[bytes - 1] = 7;
  EXPECT_EQ(static_cast<const uint8_t*>(reader)[bytes - 1], 7) << "one file's pages, shared";
  munmap(reader, bytes);
  munmap(writer, bytes);
  // Less than a huge page: mapped where the kernel chooses.
  void* small = MapShared(fd, 64 * 1024, PROT_READ);
  EXPECT_NE(small, MAP_FAILED);
  munmap(small, 64 * 1024);
  close(fd);
}

TEST(HugePagesTest, AWritersPagesBecomeHugeOnesAndKeepWhatTheyHold) {
  if (!HugePagesAreMade()) GTEST_SKIP() << "this kernel makes no 2 MiB pages of shared memory";
  const uint64_t bytes = 4 * kMiB + 8192;
  const int fd = Memfd(bytes);
  auto* writer = static_cast<uint8_t*>(MapShared(fd, bytes, PROT_READ | PROT_WRITE));
  ASSERT_NE(writer, MAP_FAILED);
  for (uint64_t i = 0; i < bytes; i += 4096) writer[i] = static_cast<uint8_t>(i / 4096 + 1);
  EXPECT_TRUE(MakeHugePages(writer, bytes));
  EXPECT_EQ(testing::ShmemPmdMappedKiB(writer), 4096u) << "the whole 2 MiB spans; the tail stays in 4 KiB";
  for (uint64_t i = 0; i < bytes; i += 4096) ASSERT_EQ(writer[i], static_cast<uint8_t>(i / 4096 + 1)) << i;
  // Another mapping of the same file maps them whole as it faults them in.
  auto* reader = static_cast<const uint8_t*>(MapShared(fd, bytes, PROT_READ, MAP_POPULATE));
  ASSERT_NE(reader, MAP_FAILED);
  EXPECT_EQ(testing::ShmemPmdMappedKiB(reader), 4096u);
  EXPECT_EQ(reader[4096], 2);
  munmap(const_cast<uint8_t*>(reader), bytes);
  munmap(writer, bytes);
  close(fd);
}

// The weights' paths: a region allocated for a load and a replica's mapping of it; a parked copy,
// and the region an unpark makes of it.
TEST(HugePagesTest, WeightsAndTheirParkedCopyLieInHugePages) {
  if (!HugePagesAreMade()) GTEST_SKIP() << "this kernel makes no 2 MiB pages of shared memory";
  HostMemory memory;
  for (uint64_t bytes : {4 * kMiB, HostMemory::kParallelPopulateBytes}) {
    const uint64_t failures = CollapseAllocFailures();
    Result<HostRegion> weights = memory.Allocate(bytes, "huge_pages_test");
    ASSERT_TRUE(weights.ok()) << weights.status().ToString();
    if (testing::ShmemPmdMappedKiB(weights->ptr) == 0) SKIP_IF_NO_HUGE_PAGE_WAS_FREE(failures);
    EXPECT_EQ(testing::ShmemPmdMappedKiB(weights->ptr), bytes / 1024) << "before the load writes them";
    std::memset(weights->ptr, 1, bytes);
    Result<HostRegion> replica = memory.Import(weights->fd, bytes, /*read_only=*/true);
    ASSERT_TRUE(replica.ok()) << replica.status().ToString();
    EXPECT_EQ(testing::ShmemPmdMappedKiB(replica->ptr), bytes / 1024) << "a replica's, populated";

    const wp_region region{weights->ptr, bytes, weights->fd};
    const uint64_t failures_before_park = CollapseAllocFailures();
    Result<int> parked = HostMemory::CopyToHost(*memory.service(), region);
    ASSERT_TRUE(parked.ok()) << parked.status().ToString();
    void* copy = MapShared(*parked, bytes, PROT_READ, MAP_POPULATE);
    ASSERT_NE(copy, MAP_FAILED);
    if (testing::ShmemPmdMappedKiB(copy) == 0) SKIP_IF_NO_HUGE_PAGE_WAS_FREE(failures_before_park);
    EXPECT_EQ(testing::ShmemPmdMappedKiB(copy), bytes / 1024) << "the parked copy, as written";
    munmap(copy, bytes);
    Result<HostRegion> unparked = memory.AllocateReusing(*parked, bytes);
    ASSERT_TRUE(unparked.ok()) << unparked.status().ToString();
    EXPECT_EQ(testing::ShmemPmdMappedKiB(unparked->ptr), bytes / 1024) << "the parked copy's pages, unparked";
    EXPECT_EQ(static_cast<const uint8_t*>(unparked->ptr)[bytes - 1], 1);
    memory.Free(*unparked);
    memory.Free(*replica);
    memory.Free(*weights);
  }
}

// Memory the supervisor kept, offered back larger for another load: the worker's kept mapping grows,
// and what it gains is made 2 MiB pages too; what it held stays as it was, not copied.
TEST(HugePagesTest, AKeptRegionThatGrowsGainsHugePages) {
  if (!HugePagesAreMade()) GTEST_SKIP() << "this kernel makes no 2 MiB pages of shared memory";
  HostMemory memory;
  const uint64_t failures = CollapseAllocFailures();
  Result<HostRegion> weights = memory.Allocate(4 * kMiB, "huge_pages_test");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  std::memset(weights->ptr, 0x3c, 4 * kMiB);
  const int supervisors = dup(weights->fd);  // what went to the supervisor with the load's reply
  memory.KeepMappingOf(weights->fd);
  memory.Free(*weights);
  ASSERT_EQ(memory.kept_mappings(), 1u);
  Result<HostRegion> grown = memory.AllocateReusing(dup(supervisors), 12 * kMiB);
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  if (testing::ShmemPmdMappedKiB(grown->ptr) < 12 * 1024) SKIP_IF_NO_HUGE_PAGE_WAS_FREE(failures);
  EXPECT_EQ(testing::ShmemPmdMappedKiB(grown->ptr), 12u * 1024) << "the pages it had and the ones it gained";
  EXPECT_EQ(static_cast<const uint8_t*>(grown->ptr)[4 * kMiB - 1], 0x3c);
  EXPECT_EQ(static_cast<const uint8_t*>(grown->ptr)[12 * kMiB - 1], 0);
  memory.KeepMappingOf(grown->fd);
  memory.Free(*grown);
  memory.ForgetMappings({static_cast<uint64_t>([&] {
    struct stat st {};
    fstat(supervisors, &st);
    return st.st_ino;
  }())});
  close(supervisors);
}

}  // namespace
}  // namespace warmpool
