// The chaos harness's "no fd leaked" check rests on its census of the supervisor's descriptors
// (chaos/fd_census.h): what it counts, and that a baseline is a census that held still.
#include "chaos/fd_census.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <vector>

#include <fmt/format.h>

namespace warmpool::chaos {
namespace {

TEST(FdCensusTest, CountsDescriptorsBesidesRegionsAndSortsTheRegionsByName) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  int weights = memfd_create("warmpool-weights-test", MFD_CLOEXEC);
  int parked = memfd_create("warmpool-parked-test", MFD_CLOEXEC);
  int other_region = memfd_create("something-else", MFD_CLOEXEC);
  ASSERT_GE(weights, 0);
  ASSERT_GE(parked, 0);
  ASSERT_GE(other_region, 0);

  std::optional<FdCensus> census = FdCensus::Take(getpid());
  ASSERT_TRUE(census.has_value());
  ASSERT_TRUE(census->others.count(pipe_fds[0]));
  EXPECT_TRUE(census->others.at(pipe_fds[0]).starts_with("pipe:[")) << census->others.at(pipe_fds[0]);
  EXPECT_TRUE(census->others.count(pipe_fds[1]));
  // Memory regions are counted apart (they come and go with models), whatever their name.
  EXPECT_FALSE(census->others.count(weights));
  EXPECT_FALSE(census->others.count(parked));
  EXPECT_FALSE(census->others.count(other_region));
  EXPECT_GE(census->weights, 1);
  EXPECT_GE(census->parked, 1);

  close(pipe_fds[1]);
  std::optional<FdCensus> after = FdCensus::Take(getpid());
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->count(), census->count() - 1);
  std::string difference = after->DifferenceFrom(*census);
  EXPECT_NE(difference.find(fmt::format("at the start only: {} pipe:[", pipe_fds[1])), std::string::npos)
      << difference;
  EXPECT_EQ(difference.find("now only"), std::string::npos) << difference;
  EXPECT_NE(census->DifferenceFrom(*after).find(fmt::format("now only: {} pipe:[", pipe_fds[1])), std::string::npos);
  EXPECT_EQ(after->DifferenceFrom(*after), "");
  for (int fd : {pipe_fds[0], weights, parked, other_region}) close(fd);
}

TEST(FdCensusTest, AProcessThatIsGoneHasNoCensus) {
  EXPECT_FALSE(FdCensus::Take(-1).has_value());
  EXPECT_FALSE(FdCensus::Settled(-1, 1, 10).has_value());
}

// Scripted looks at a process: each call returns the next census.
std::function<std::optional<FdCensus>()> Looks(std::vector<std::optional<FdCensus>> looks) {
  auto next = std::make_shared<size_t>(0);
  return [looks = std::move(looks), next]() -> std::optional<FdCensus> {
    const size_t i = std::min(*next, looks.size() - 1);
    ++*next;
    return looks[i];
  };
}

FdCensus With(std::map<int, std::string> others) { return FdCensus{std::move(others), 0, 0}; }

// The flake this prevents: one look caught a descriptor a call opens and closes (sd_notify's socket),
// and every later check then found "one fewer than at the start".
TEST(FdCensusTest, ADescriptorSeenInOneLookOnlyIsNotInASettledCensus) {
  FdCensus steady = With({{0, "/dev/null"}, {5, "socket:[1]"}});
  FdCensus transient = With({{0, "/dev/null"}, {5, "socket:[1]"}, {6, "socket:[2]"}});
  std::optional<FdCensus> settled = FdCensus::Settled(Looks({transient, steady, steady}), 1, 1000);
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(*settled, steady);
}

TEST(FdCensusTest, ADescriptorHeldOverTheSettleIntervalIsCounted) {
  FdCensus held = With({{0, "/dev/null"}, {6, "socket:[2]"}});
  std::optional<FdCensus> settled = FdCensus::Settled(Looks({held, held}), 1, 1000);
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(*settled, held);
}

TEST(FdCensusTest, ADescriptorReplacedUnderTheSameNumberIsAChange) {
  FdCensus before = With({{6, "socket:[2]"}});
  FdCensus after = With({{6, "pipe:[3]"}});
  std::optional<FdCensus> settled = FdCensus::Settled(Looks({before, after, after}), 1, 1000);
  ASSERT_TRUE(settled.has_value());
  EXPECT_EQ(*settled, after);
}

TEST(FdCensusTest, NothingThatHoldsStillIsNoBaseline) {
  int n = 0;
  auto changing = [&n]() -> std::optional<FdCensus> { return With({{n++, "pipe:[1]"}}); };
  EXPECT_FALSE(FdCensus::Settled(changing, 1, 20).has_value());
}

}  // namespace
}  // namespace warmpool::chaos
