// The segment layout, SegmentView over a byte vector (a second view stands in for another process),
// and SharedSegment over a real POSIX shared-memory object.
#include "shm/segment.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shm/layout.h"
#include "tests/text.h"

namespace warmpool::shm {
namespace {

using ::warmpool::testing::Contains;

TEST(LayoutTest, VersionStringIsPinned) {
  // Changing any struct below must bump kLayoutVersion and this string together.
  EXPECT_STREQ(kLayoutString,
               "warmpool-shm-v6:hdr256:model512:worker128:inflight32:park:starttime:held16:changes:budgets8:"
               "stats64+1664");
  EXPECT_EQ(kLayoutVersion, 6u);
  EXPECT_EQ(std::string(kMagic, 8), "WARMPOOL");
  EXPECT_EQ(kNil, 0xFFFFFFFFu);
}

TEST(LayoutTest, SizesAndOffsets) {
  EXPECT_EQ(sizeof(SegmentHeader), 256u);
  EXPECT_EQ(offsetof(SegmentHeader, magic), 0u);
  EXPECT_EQ(offsetof(SegmentHeader, layout_version), 8u);
  EXPECT_EQ(offsetof(SegmentHeader, header_size), 12u);
  EXPECT_EQ(offsetof(SegmentHeader, segment_size), 16u);
  EXPECT_EQ(offsetof(SegmentHeader, supervisor_pid), 64u);
  EXPECT_EQ(offsetof(SegmentHeader, lru_head), 76u);
  EXPECT_EQ(offsetof(SegmentHeader, park_used_bytes), 88u);
  EXPECT_EQ(offsetof(SegmentHeader, supervisor_start_ticks), 104u);
  EXPECT_EQ(offsetof(SegmentHeader, changes), 112u);
  EXPECT_EQ(offsetof(SegmentHeader, device_used_bytes), 120u);
  EXPECT_EQ(offsetof(SegmentHeader, device_budget_bytes), 184u);
  EXPECT_EQ(sizeof(ModelRecord), 512u);
  EXPECT_EQ(offsetof(ModelRecord, state), 4u);
  EXPECT_EQ(offsetof(ModelRecord, name), 8u);
  EXPECT_EQ(offsetof(ModelRecord, engine), 72u);
  EXPECT_EQ(offsetof(ModelRecord, path), 88u);
  EXPECT_EQ(offsetof(ModelRecord, weight_bytes), 344u);
  EXPECT_EQ(offsetof(ModelRecord, lru_prev), 392u);
  EXPECT_EQ(offsetof(ModelRecord, last_error), 440u);
  EXPECT_EQ(sizeof(WorkerRecord), 128u);
  EXPECT_EQ(offsetof(WorkerRecord, generation), 12u);
  EXPECT_EQ(offsetof(WorkerRecord, models), 28u);
  EXPECT_EQ(offsetof(WorkerRecord, outstanding), 48u);
  EXPECT_EQ(offsetof(WorkerRecord, held), 56u);
  EXPECT_EQ(sizeof(InflightSlot), 32u);
  EXPECT_EQ(offsetof(InflightSlot, request_id), 8u);
  EXPECT_EQ(offsetof(InflightSlot, model), 16u);
  EXPECT_EQ(offsetof(InflightSlot, started_ns), 24u);
}

TEST(LayoutTest, TagPacking) {
  uint64_t tag = MakeTag(0xABCDEF01u, 0x1234, SlotState::kTaken);
  EXPECT_EQ(tag, 0xABCDEF0112340001ull);
  EXPECT_EQ(TagGeneration(tag), 0xABCDEF01u);
  EXPECT_EQ(TagWorker(tag), 0x1234);
  EXPECT_EQ(TagState(tag), SlotState::kTaken);
  EXPECT_EQ(MakeTag(0, 0, SlotState::kFree), 0u);
}

TEST(SegmentSizeTest, RegionsAre64ByteAligned) {
  // header | models | workers | inflight | stats (64 + 1664 per model)
  EXPECT_EQ(SegmentSize(Limits{1, 1, 1}), 2688u);   // 256 | 768 | 896 | 960 | 2688
  EXPECT_EQ(SegmentSize(Limits{3, 3, 3}), 7360u);   // 256 | 1792 | 2176 | 2304 | 7360
  EXPECT_EQ(SegmentSize(Limits{}), 592192u);        // 256 models, 16 workers, 1024 slots
  for (uint32_t n : {1u, 2u, 5u, 7u, 33u}) {
    EXPECT_EQ(SegmentSize(Limits{n, n, n}) % 64, 0u) << n;
  }
}

class SegmentViewTest : public ::testing::Test {
 protected:
  static constexpr Limits kLimits{4, 2, 8};
  std::vector<std::byte> bytes_ = std::vector<std::byte>(SegmentSize(kLimits));

  SegmentView MustFormat() {
    Result<SegmentView> v = SegmentView::Format(bytes_, kLimits, {1 << 20, 2 << 20}, 4242);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? *v : SegmentView();
  }
  Status AttachStatus(std::span<std::byte> span) {
    return SegmentView::Attach(span, "warmpool.test").status();
  }
};

TEST_F(SegmentViewTest, FormatWritesHeaderAndEmptyTables) {
  std::fill(bytes_.begin(), bytes_.end(), std::byte{0x5A});
  SegmentView v = MustFormat();
  ASSERT_TRUE(v.valid());
  const SegmentHeader& h = v.header();
  EXPECT_EQ(std::memcmp(h.magic, "WARMPOOL", 8), 0);
  EXPECT_EQ(h.layout_version, kLayoutVersion);
  EXPECT_EQ(h.header_size, 256u);
  EXPECT_EQ(h.segment_size, 9536u);
  EXPECT_EQ(h.max_models, 4u);
  EXPECT_EQ(h.max_workers, 2u);
  EXPECT_EQ(h.max_inflight, 8u);
  EXPECT_EQ(h.device_count, 2u);
  EXPECT_EQ(h.models_offset, 256u);
  EXPECT_EQ(h.workers_offset, 256u + 4 * 512);
  EXPECT_EQ(h.inflight_offset, 256u + 4 * 512 + 2 * 128);
  EXPECT_EQ(h.stats_offset, 256u + 4 * 512 + 2 * 128 + 8 * 32);
  EXPECT_EQ(h.supervisor_pid, 4242);
  EXPECT_EQ(h.lru_head, kNil);
  EXPECT_EQ(h.lru_tail, kNil);
  EXPECT_EQ(h.lru_length, 0u);
  EXPECT_EQ(h.device_budget_bytes[0], 1u << 20);
  EXPECT_EQ(h.device_budget_bytes[1], 2u << 20);
  EXPECT_EQ(h.device_budget_bytes[2], 0u);
  for (uint64_t used : h.device_used_bytes) EXPECT_EQ(used, 0u);
  for (uint32_t i = 0; i < 4; i++) {
    EXPECT_EQ(v.model(i).state, 0u);
    EXPECT_EQ(v.model(i).worker_slot, kNil);
    EXPECT_EQ(v.model(i).lru_prev, kNil);
    EXPECT_EQ(v.model(i).lru_next, kNil);
    EXPECT_EQ(v.model(i).name[0], '\0');
  }
  for (uint32_t i = 0; i < 2; i++) EXPECT_EQ(v.worker(i).last_exit, -1);
  for (uint32_t i = 0; i < 8; i++) EXPECT_EQ(v.inflight(i).tag, 0u);
  EXPECT_EQ(reinterpret_cast<std::byte*>(&v.inflight(7)) + sizeof(InflightSlot),
            bytes_.data() + 256 + 4 * 512 + 2 * 128 + 8 * 32);
}

TEST_F(SegmentViewTest, SecondViewSeesWritesOfTheFirst) {
  SegmentView writer = MustFormat();
  Result<SegmentView> reader = SegmentView::Attach(bytes_, "warmpool.test");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  EXPECT_EQ(reader->max_models(), 4u);
  EXPECT_EQ(reader->max_workers(), 2u);
  EXPECT_EQ(reader->max_inflight(), 8u);
  EXPECT_EQ(reader->header().supervisor_pid, 4242);

  std::strcpy(writer.model(2).name, "llama");
  writer.model(2).weight_bytes = 123456;
  writer.worker(1).pid = 999;
  writer.inflight(5).tag = MakeTag(3, 1, SlotState::kTaken);
  writer.header().lru_length = 7;
  EXPECT_STREQ(reader->model(2).name, "llama");
  EXPECT_EQ(reader->model(2).weight_bytes, 123456u);
  EXPECT_EQ(reader->worker(1).pid, 999);
  EXPECT_EQ(reader->inflight(5).tag, MakeTag(3, 1, SlotState::kTaken));
  EXPECT_EQ(reader->header().lru_length, 7u);
  EXPECT_EQ(&reader->model(3), &writer.model(3));
}

TEST_F(SegmentViewTest, FormatIntoLargerBufferRecordsItsSize) {
  bytes_.resize(12288);
  SegmentView v = MustFormat();
  EXPECT_EQ(v.header().segment_size, 12288u);
  EXPECT_TRUE(SegmentView::Attach(bytes_, "warmpool.test").ok());
}

TEST_F(SegmentViewTest, FormatRejectsBadLimits) {
  std::vector<std::byte> big(1 << 16);
  auto format = [&](Limits l, uint32_t devices = 1) {
    return SegmentView::Format(big, l, std::vector<uint64_t>(devices, 0), 1).status();
  };
  EXPECT_EQ(format({0, 1, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(format({kNil, 1, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(format({1, 0, 1}).code(), Code::kInvalidArgument);
  EXPECT_EQ(format({1, 1, 0}).code(), Code::kInvalidArgument);
  Status wide = format({1, 0x10000, 1});
  EXPECT_EQ(wide.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(wide.message(), "max_workers 65536 (1..65535)")) << wide.message();
  EXPECT_EQ(format({1, 1, 1}, 0).code(), Code::kInvalidArgument);
  Status devices = format({1, 1, 1}, kMaxDevices + 1);
  EXPECT_EQ(devices.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(devices.message(), "device count 9 out of range 1..8")) << devices.message();
  EXPECT_TRUE(format({1, 1, 1}, kMaxDevices).ok());
  EXPECT_TRUE(format({1, 1, 1}, 1).ok());
}

TEST_F(SegmentViewTest, FormatRejectsTooFewBytes) {
  std::vector<std::byte> small(SegmentSize(kLimits) - 1);
  Status s = SegmentView::Format(small, kLimits, {0}, 1).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(s.message(), "9535 bytes is smaller than the 9536 needed")) << s.message();
}

TEST_F(SegmentViewTest, AttachRefusesBadMagic) {
  MustFormat();
  bytes_[3] = std::byte{'X'};
  Status s = AttachStatus(bytes_);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "segment warmpool.test is not a warmpool segment (bad magic)"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "pass another --instance")) << s.message();
}

TEST_F(SegmentViewTest, AttachRefusesOtherLayoutVersion) {
  SegmentView v = MustFormat();
  v.header().layout_version = kLayoutVersion + 1;
  Status s = AttachStatus(bytes_);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), fmt::format("made by layout {}, this binary expects {}",
                                                kLayoutVersion + 1, kLayoutVersion)))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "stop the old daemon or use binaries of the same version"))
      << s.message();

  v.header().layout_version = kLayoutVersion;
  v.header().header_size = 200;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().header_size = sizeof(SegmentHeader);
  EXPECT_TRUE(AttachStatus(bytes_).ok());
}

TEST_F(SegmentViewTest, AttachRefusesTruncatedBytes) {
  MustFormat();
  for (size_t n : {size_t{0}, size_t{100}, sizeof(SegmentHeader) - 1}) {
    Status s = AttachStatus(std::span<std::byte>(bytes_.data(), n));
    EXPECT_EQ(s.code(), Code::kFailedPrecondition) << n;
    EXPECT_TRUE(Contains(s.message(), "is " + std::to_string(n) + " bytes, too small")) << s.message();
    EXPECT_TRUE(Contains(s.message(), "rm /dev/shm/warmpool.test")) << s.message();
  }
}

TEST_F(SegmentViewTest, AttachRefusesSizeMismatch) {
  SegmentView v = MustFormat();
  Status s = AttachStatus(std::span<std::byte>(bytes_.data(), 1024));
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(s.message(), "inconsistent sizes (header says 9536 bytes, mapped 1024)"))
      << s.message();
  EXPECT_TRUE(Contains(s.message(), "remove /dev/shm/warmpool.test")) << s.message();

  // A header claiming more tables than the mapping holds.
  v.header().max_inflight = 1000;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().max_inflight = 8;
  v.header().workers_offset += 64;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().workers_offset -= 64;
  v.header().device_count = 0;
  EXPECT_EQ(AttachStatus(bytes_).code(), Code::kFailedPrecondition);
  v.header().device_count = 2;
  EXPECT_TRUE(AttachStatus(bytes_).ok());
}

// SharedSegment over /dev/shm. Every test uses its own instance name and checks at teardown that
// nothing is left behind.
class SharedSegmentTest : public ::testing::Test {
 protected:
  static constexpr Limits kLimits{4, 2, 8};

  void SetUp() override {
    instance_ = "ut-" + std::to_string(getpid()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name();
    path_ = "/dev/shm/" + SharedSegment::NameFor(instance_);
    shm_unlink(("/" + SharedSegment::NameFor(instance_)).c_str());
  }
  void TearDown() override {
    bool leftover = Exists();
    shm_unlink(("/" + SharedSegment::NameFor(instance_)).c_str());
    EXPECT_FALSE(leftover) << path_ << " left behind";
  }
  bool Exists() const {
    struct stat st;
    return stat(path_.c_str(), &st) == 0;
  }
  unsigned Mode() const {
    struct stat st;
    EXPECT_EQ(stat(path_.c_str(), &st), 0) << path_ << ": " << std::strerror(errno);
    return st.st_mode & 07777;
  }
  Result<SharedSegment> Create(std::optional<gid_t> observer_group = std::nullopt) {
    return SharedSegment::Create(instance_, kLimits, {1 << 20}, observer_group);
  }
  gid_t Group() const {
    struct stat st;
    EXPECT_EQ(stat(path_.c_str(), &st), 0) << path_ << ": " << std::strerror(errno);
    return st.st_gid;
  }

  std::string instance_;
  std::string path_;
};

TEST_F(SharedSegmentTest, CreateMakesA0600ObjectOfTheRightSize) {
  Result<SharedSegment> seg = Create();
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(seg->name(), "warmpool." + instance_);
  ASSERT_TRUE(Exists());
  EXPECT_EQ(Mode(), 0600u);
  struct stat st;
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), SegmentSize(kLimits));
  EXPECT_EQ(seg->view().header().supervisor_pid, getpid());
  EXPECT_EQ(seg->view().header().supervisor_start_ticks, ProcessStartTicks(getpid()));
  EXPECT_NE(seg->view().header().supervisor_start_ticks, 0u);
  EXPECT_EQ(seg->view().header().device_budget_bytes[0], 1u << 20);
  EXPECT_EQ(seg->view().max_models(), 4u);
}

TEST_F(SharedSegmentTest, AnObserverGroupGetsReadAccessDespiteUmask) {
  mode_t old = umask(077);
  Result<SharedSegment> seg = Create(getgid());
  umask(old);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(Mode(), 0640u);
  EXPECT_EQ(Group(), getgid());
}

TEST_F(SharedSegmentTest, TheObserverGroupOwnsTheSegment) {
  if (geteuid() != 0) GTEST_SKIP() << "giving a file to another group needs root";
  const gid_t other = 65534;  // nogroup
  Result<SharedSegment> seg = Create(other);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  EXPECT_EQ(Group(), other);
  EXPECT_EQ(Mode(), 0640u);
}

TEST_F(SharedSegmentTest, OpenReadOnlySeesTheCreatorsWrites) {
  Result<SharedSegment> creator = Create();
  ASSERT_TRUE(creator.ok()) << creator.status().ToString();
  Result<SharedSegment> observer = SharedSegment::Open(instance_, /*read_only=*/true);
  ASSERT_TRUE(observer.ok()) << observer.status().ToString();
  EXPECT_EQ(observer->view().header().supervisor_pid, getpid());
  EXPECT_EQ(observer->view().max_inflight(), 8u);
  EXPECT_NE(observer->view().base(), creator->view().base());  // a separate mapping

  std::strcpy(creator->view().model(1).name, "phi");
  creator->view().header().lru_length = 3;
  EXPECT_STREQ(observer->view().model(1).name, "phi");
  EXPECT_EQ(observer->view().header().lru_length, 3u);
}

TEST_F(SharedSegmentTest, OpenOfAMissingInstanceSaysWhatToCheck) {
  Result<SharedSegment> seg = SharedSegment::Open(instance_, true);
  ASSERT_FALSE(seg.ok());
  EXPECT_EQ(seg.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(seg.status().message(), "--instance " + instance_)) << seg.status().message();
}

TEST_F(SharedSegmentTest, GarbageObjectIsRefusedByOpenAndReplacedByCreate) {
  int fd = shm_open(("/" + SharedSegment::NameFor(instance_)).c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  close(fd);
  Result<SharedSegment> opened = SharedSegment::Open(instance_, true);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(opened.status().message(), "too small")) << opened.status().message();

  Result<SharedSegment> created = Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_TRUE(SharedSegment::Open(instance_, true).ok());
}

TEST_F(SharedSegmentTest, DestructorAndRemoveDeleteTheName) {
  {
    Result<SharedSegment> seg = Create();
    ASSERT_TRUE(seg.ok());
    SharedSegment moved = std::move(*seg);  // ownership moves; the moved-from one removes nothing
    EXPECT_TRUE(Exists());
  }
  EXPECT_FALSE(Exists());

  Result<SharedSegment> seg = Create();
  ASSERT_TRUE(seg.ok());
  seg->view().header().lru_length = 5;
  seg->Remove();
  EXPECT_FALSE(Exists());
  EXPECT_EQ(seg->view().header().lru_length, 5u);  // the mapping outlives the name
}

TEST_F(SharedSegmentTest, ObserverDoesNotRemoveTheSegment) {
  Result<SharedSegment> creator = Create();
  ASSERT_TRUE(creator.ok());
  { ASSERT_TRUE(SharedSegment::Open(instance_, true).ok()); }
  EXPECT_TRUE(Exists());
}

// Kills and reaps a forked child when the test ends, whatever happened.
struct ChildGuard {
  pid_t pid = -1;
  ~ChildGuard() { Reap(); }
  void Reap() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }
};

TEST_F(SharedSegmentTest, CreateRefusesALiveSupervisorAndReplacesADeadOnesSegment) {
  int ready[2], hold[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(hold), 0);
  ChildGuard child;
  child.pid = fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) {
    // The "other supervisor": creates the segment, then waits until killed.
    close(ready[0]);
    close(hold[1]);
    Result<SharedSegment> seg = Create();
    char c = seg.ok() ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    (void)!read(hold[0], &c, 1);
    _exit(0);
  }
  close(ready[1]);
  close(hold[0]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  ASSERT_EQ(c, 'y');

  Result<SharedSegment> refused = Create();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(refused.status().message(),
                       "is in use by warmpoold pid " + std::to_string(child.pid)))
      << refused.status().message();
  EXPECT_TRUE(Contains(refused.status().message(), "--instance")) << refused.status().message();
  // The live supervisor's segment is untouched.
  {
    Result<SharedSegment> observer = SharedSegment::Open(instance_, true);
    ASSERT_TRUE(observer.ok());
    EXPECT_EQ(observer->view().header().supervisor_pid, child.pid);
  }

  // Killed without a chance to clean up: its segment is stale and Create replaces it.
  child.Reap();
  close(hold[1]);
  ASSERT_TRUE(Exists());
  Result<SharedSegment> created = Create();
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->view().header().supervisor_pid, getpid());
  EXPECT_EQ(Mode(), 0600u);
}

TEST_F(SharedSegmentTest, APidReusedByAnotherProcessIsNotALiveSupervisor) {
  // A supervisor killed long ago, whose pid now names some other live process (here: a child
  // that never made a segment). kill(pid, 0) says alive; the start time says it is not the one.
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  ChildGuard child;
  child.pid = fork();
  ASSERT_GE(child.pid, 0);
  if (child.pid == 0) {
    close(hold[1]);
    char c;
    (void)!read(hold[0], &c, 1);
    _exit(0);
  }
  close(hold[0]);
  pid_t creator = fork();  // makes the segment and dies without cleaning up, as under SIGKILL
  ASSERT_GE(creator, 0);
  if (creator == 0) _exit(Create().ok() ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(creator, &status, 0), creator);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(Exists());
  {
    Result<SharedSegment> stale = SharedSegment::Open(instance_, /*read_only=*/false);
    ASSERT_TRUE(stale.ok()) << stale.status().ToString();
    SegmentHeader& h = stale->view().header();
    h.supervisor_pid = child.pid;
    h.supervisor_start_ticks = ProcessStartTicks(child.pid) + 12345;  // another process's start
  }
  EXPECT_TRUE(SupervisorAlive(child.pid, ProcessStartTicks(child.pid)));
  EXPECT_FALSE(SupervisorAlive(child.pid, ProcessStartTicks(child.pid) + 12345));
  Result<SharedSegment> created = Create();
  ASSERT_TRUE(created.ok()) << "the stale segment of a reused pid blocks the start: "
                            << created.status().ToString();
  EXPECT_EQ(created->view().header().supervisor_pid, getpid());
  close(hold[1]);
}

}  // namespace
}  // namespace warmpool::shm
