// What warmpoold takes back at start (supervisor/warm_store.h): the newest manifest of its own
// instance and the handles it names, each a memfd of the bytes described whose fingerprint still
// matches; anything else is closed. No service manager is needed to receive.
#include "supervisor/warm_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/unit/kept_weights.h"

namespace warmpool::supervisor {
namespace {

using testing::Kept;
using testing::Region;

bool Open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// A manifest of `kept` (for `instance`) and the descriptors to pass, named as the store names them.
std::vector<PassedDescriptor> Passed(const std::vector<KeptWeights>& kept, const std::string& instance,
                                     uint64_t sequence = 1) {
  v1::KeptManifest manifest;
  manifest.set_instance(instance);
  manifest.set_sequence(sequence);
  std::vector<PassedDescriptor> passed;
  for (size_t i = 0; i < kept.size(); i++) {
    const std::string name = KeptName(kept[i], "t" + std::to_string(i));
    *manifest.add_models() = DescribeKept(kept[i], name, RegionFingerprint(kept[i].weights.handle));
    passed.push_back({kept[i].weights.handle, name});
  }
  Result<int> fd = WriteManifest(manifest);
  EXPECT_TRUE(fd.ok());
  passed.insert(passed.begin(), PassedDescriptor{*fd, "wp.manifest." + std::to_string(sequence)});
  return passed;
}

TEST(WarmStoreTest, TheManifestsHandlesComeBackInTheirOrderAndOthersAreLeftInPlace) {
  const int a = Region(1 << 16, 1), b = Region(4096, 2);
  std::vector<PassedDescriptor> passed = Passed({Kept("a", a, 1 << 16, false), Kept("b", b, 4096, true)}, "x");
  passed.push_back({99, "warmpool.socket"});  // not the store's: left for the caller
  WarmStore store("x", /*enabled=*/false);
  std::vector<KeptWeights> kept = store.Receive(passed);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].name, "a");
  EXPECT_EQ(kept[0].weights.handle, a);
  EXPECT_EQ(kept[0].weights.weight_bytes, 1u << 16);
  EXPECT_EQ(kept[0].weights.version, (FileVersion{(1 << 16) + 10, 5, 6, 7, 8}));
  EXPECT_TRUE(kept[1].parked);
  ASSERT_EQ(passed.size(), 1u);
  EXPECT_EQ(passed[0].name, "warmpool.socket");
  close(a);
  close(b);
}

// An older warmpoold wrote the description field by field (numbers now reserved in KeptModel):
// to this one such a record has no `weights`, and its handle is closed, not guessed at.
TEST(WarmStoreTest, ARecordWithoutTheWeightsDescriptionIsAnOlderDaemonsAndIsClosed) {
  const int a = Region(4096, 1), b = Region(4096, 2);
  std::vector<KeptWeights> kept = {Kept("a", a, 4096, false), Kept("b", b, 4096, false)};
  v1::KeptManifest manifest;
  manifest.set_instance("x");
  manifest.set_sequence(1);
  std::vector<PassedDescriptor> passed;
  for (size_t i = 0; i < kept.size(); i++) {
    const std::string name = KeptName(kept[i], "t" + std::to_string(i));
    v1::KeptModel* record = manifest.add_models();
    *record = DescribeKept(kept[i], name, RegionFingerprint(kept[i].weights.handle));
    if (i == 0) record->clear_weights();
    passed.push_back({kept[i].weights.handle, name});
  }
  Result<int> fd = WriteManifest(manifest);
  ASSERT_TRUE(fd.ok());
  passed.insert(passed.begin(), PassedDescriptor{*fd, "wp.manifest.1"});
  WarmStore store("x", false);
  std::vector<KeptWeights> received = store.Receive(passed);
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].name, "b");
  EXPECT_EQ(received[0].weights.header, "b header");
  EXPECT_FALSE(Open(a)) << "closed";
  close(b);
}

TEST(WarmStoreTest, MemoryReusedSinceItWasStoredIsClosedNotAdopted) {
  const int a = Region(1 << 20, 1);
  std::vector<PassedDescriptor> passed = Passed({Kept("a", a, 1 << 20, false)}, "x");
  std::string other(1 << 20, '\x5a');  // another model's bytes, written into the same memory
  ASSERT_EQ(pwrite(a, other.data(), other.size(), 0), static_cast<ssize_t>(other.size()));
  WarmStore store("x", false);
  EXPECT_TRUE(store.Receive(passed).empty());
  EXPECT_FALSE(Open(a)) << "closed";
}

TEST(WarmStoreTest, ARegionSmallerThanDescribedOrNotAMemfdIsClosed) {
  const int a = Region(4096, 1);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  KeptWeights big = Kept("a", a, 8192, false);  // describes more than it holds
  KeptWeights device = Kept("d", pipe_fds[0], 4096, false);  // cuda's exported memory is no memfd
  KeptWeights parked = Kept("p", pipe_fds[1], 4096, true);   // a parked copy always is
  {
    std::vector<PassedDescriptor> passed = Passed({big, device, parked}, "x");
    WarmStore store("x", false);
    EXPECT_TRUE(store.Receive(passed, /*device_memfds=*/true).empty());
    EXPECT_FALSE(Open(a));
    EXPECT_FALSE(Open(pipe_fds[0]));
    EXPECT_FALSE(Open(pipe_fds[1]));
  }
  ASSERT_EQ(pipe(pipe_fds), 0);
  device.weights.handle = pipe_fds[0];
  std::vector<PassedDescriptor> passed = Passed({device}, "x");
  WarmStore store("x", false);
  std::vector<KeptWeights> kept = store.Receive(passed, /*device_memfds=*/false);
  ASSERT_EQ(kept.size(), 1u) << "on cuda a device handle need not be a memfd";
  close(pipe_fds[0]);
  close(pipe_fds[1]);
}

TEST(WarmStoreTest, AnotherInstancesOrAnUnreadableManifestIsIgnoredForTheNewestGoodOne) {
  const int a = Region(4096, 1);
  std::vector<PassedDescriptor> passed = Passed({Kept("a", a, 4096, false)}, "x", 4);
  // Newer ones that do not count: garbage, and another instance's.
  int garbage = memfd_create("m", MFD_CLOEXEC);
  ASSERT_EQ(write(garbage, "\xff\xff\xff", 3), 3);
  passed.push_back({garbage, "wp.manifest.9"});
  const int b = Region(4096, 2);
  std::vector<PassedDescriptor> theirs = Passed({Kept("b", b, 4096, false)}, "y", 7);
  passed.insert(passed.end(), theirs.begin(), theirs.end());
  WarmStore store("x", false);
  std::vector<KeptWeights> kept = store.Receive(passed);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].name, "a");
  EXPECT_FALSE(Open(b)) << "named by no manifest of ours: closed";
  close(a);
}

TEST(WarmStoreTest, AHeaderTooLargeForTheManifestIsNotKept) {
  KeptWeights k = Kept("a", 3, 10, false);
  EXPECT_TRUE(Keepable(k));
  k.weights.header.assign(WarmStore::kMaxKeptHeaderBytes + 1, 'h');
  EXPECT_FALSE(Keepable(k));
  k.weights.header = "h";
  k.weights.handle = -1;
  EXPECT_FALSE(Keepable(k));
}

}  // namespace
}  // namespace warmpool::supervisor
