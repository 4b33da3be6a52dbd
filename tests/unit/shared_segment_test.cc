// SharedSegment over a real POSIX shared-memory object: created 0600 (or for an observer group),
// opened read-only, refused when garbage or a live supervisor's, replaced when its supervisor died.
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
