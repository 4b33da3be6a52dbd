// The configuration's machine-dependent defaults: the socket's place, the budget from physical
// memory, and the client and peer byte shares (FinishDefaults, FinishShares).
#include "supervisor/config.h"

#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "tests/text.h"

namespace warmpool::supervisor {
namespace {

using ::warmpool::testing::Contains;

// Saves XDG_RUNTIME_DIR and puts it back, so tests may set or unset it freely.
class FinishDefaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* v = std::getenv("XDG_RUNTIME_DIR")) saved_ = v;
  }
  void TearDown() override {
    if (saved_) setenv("XDG_RUNTIME_DIR", saved_->c_str(), 1);
    else unsetenv("XDG_RUNTIME_DIR");
  }
  std::optional<std::string> saved_;
};

TEST_F(FinishDefaultsTest, SocketUnderXdgRuntimeDir) {
  ASSERT_EQ(setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1), 0);
  Config c;
  FinishDefaults(c);
  EXPECT_EQ(c.socket_path, "/run/user/4242/warmpool.sock");
}

TEST_F(FinishDefaultsTest, SocketInTmpWithoutXdgRuntimeDir) {
  ASSERT_EQ(unsetenv("XDG_RUNTIME_DIR"), 0);
  Config c;
  FinishDefaults(c);
  EXPECT_EQ(c.socket_path, "/tmp/warmpool-" + std::to_string(getuid()) + ".sock");
  ASSERT_EQ(setenv("XDG_RUNTIME_DIR", "relative/dir", 1), 0);  // not absolute: ignored
  Config d;
  FinishDefaults(d);
  EXPECT_EQ(d.socket_path, "/tmp/warmpool-" + std::to_string(getuid()) + ".sock");
}

TEST_F(FinishDefaultsTest, ConfiguredValuesAreKept) {
  ASSERT_EQ(setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1), 0);
  Config c;
  c.socket_path = "/srv/wp.sock";
  c.budget_bytes = 12345;
  c.workers_per_device = 3;
  FinishDefaults(c);
  EXPECT_EQ(c.socket_path, "/srv/wp.sock");
  EXPECT_EQ(c.budget_bytes, 12345u);
  EXPECT_EQ(c.workers_per_device, 3u);
}

TEST_F(FinishDefaultsTest, BudgetIsAQuarterOfPhysicalMemory) {
  Config c;
  c.workers_per_device = 0;
  FinishDefaults(c);
  uint64_t physical = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                      static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  EXPECT_GT(c.budget_bytes, 0u);
  EXPECT_EQ(c.budget_bytes, physical / 4);
  EXPECT_EQ(c.workers_per_device, 1u);
}

TEST(FinishSharesTest, ClientBytesFollowTheMachineAndEachPeerGetsAQuarter) {
  Config c;  // nothing configured
  FinishShares(c, 24ull << 30, 1024);
  // A 64th of 24 GiB: four hostile clients of one user hold at most two quarters of it
  // (requests and unread replies), about 200 MiB, not 1.6 GiB.
  EXPECT_EQ(c.max_queued_bytes, 384ull << 20);
  EXPECT_EQ(c.max_queued_bytes_per_peer, 96ull << 20);
  EXPECT_EQ(c.max_unread_reply_bytes_per_peer, 96ull << 20);
  // Connections: a quarter of half the descriptors (1024 / 2 / 4), below max_connections / 4.
  EXPECT_EQ(c.max_connections_per_peer, 128u);
  EXPECT_EQ(c.max_requests_per_peer, (1024u + 1024u) / 4);
  EXPECT_EQ(c.reserved_connections, 16u);
  EXPECT_EQ(c.request_read_timeout_ms, 10'000u);

  Config small;
  FinishShares(small, 2ull << 30, 64);
  EXPECT_EQ(small.max_queued_bytes, 256ull << 20);  // the floor
  EXPECT_EQ(small.max_connections_per_peer, 8u);    // 64 descriptors: 8 for one user
  // Never below one frame, or a request as large as the frame limit could never be served.
  EXPECT_EQ(small.max_queued_bytes_per_peer, 64ull << 20);
  EXPECT_EQ(small.max_unread_reply_bytes_per_peer, (64ull << 20) + (64u << 10));

  Config big;
  FinishShares(big, 1ull << 40, 1 << 20);
  EXPECT_EQ(big.max_queued_bytes, 1ull << 30);  // the ceiling
  EXPECT_EQ(big.max_connections_per_peer, 256u);  // a quarter of max_connections
}

TEST(FinishSharesTest, ConfiguredValuesAreKept) {
  Config c;
  ASSERT_TRUE(ApplyToml(c,
                        "[limits]\nmax_queued_bytes = \"2GiB\"\nmax_connections_per_peer = 5\n"
                        "max_requests_per_peer = 7\nmax_queued_bytes_per_peer = \"100MiB\"\n"
                        "max_unread_reply_bytes_per_peer = \"200MiB\"\nreserved_connections = 3\n"
                        "request_read_timeout = \"2s\"\n",
                        "t.toml").ok());
  FinishShares(c, 24ull << 30, 1024);
  EXPECT_EQ(c.max_queued_bytes, 2ull << 30);
  EXPECT_EQ(c.max_connections_per_peer, 5u);
  EXPECT_EQ(c.max_requests_per_peer, 7u);
  EXPECT_EQ(c.max_queued_bytes_per_peer, 100ull << 20);
  EXPECT_EQ(c.max_unread_reply_bytes_per_peer, 200ull << 20);
  EXPECT_EQ(c.reserved_connections, 3u);
  EXPECT_EQ(c.request_read_timeout_ms, 2000u);
}

TEST(FinishSharesTest, BadValuesAreRefused) {
  Config c;
  Status s = ApplyToml(c, "[limits]\nrequest_read_timeout = \"10ms\"\n", "t.toml");
  EXPECT_NE(s.message().find("limits.request_read_timeout must be between 100ms and 1h"), std::string::npos)
      << s.message();
  s = ApplyToml(c, "[limits]\nreserved_connections = 5000\n", "t.toml");
  EXPECT_NE(s.message().find("limits.reserved_connections must be an integer from 0 to 1024"), std::string::npos)
      << s.message();
  s = ApplyToml(c, "[limits]\nmax_connections_per_peer = -1\n", "t.toml");
  EXPECT_FALSE(s.ok());
}

}  // namespace
}  // namespace warmpool::supervisor
