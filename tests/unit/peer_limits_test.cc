// Each peer's share of the client socket, decided without sockets (supervisor/peer_limits.h):
// one user past its share leaves room for another, the reserve takes what is past a share and
// no peer takes all of it, requests and their bytes are counted per peer, and the connections
// cut off for unread replies are the right ones.
#include <gtest/gtest.h>

#include "supervisor/peer_limits.h"

namespace warmpool::supervisor {
namespace {

PeerKey User(uid_t uid) {
  PeerKey k;
  k.uid = uid;
  return k;
}

PeerKey Tcp(const std::string& address) {
  PeerKey k;
  k.tcp = true;
  k.uid = static_cast<uid_t>(-1);
  k.address = address;
  return k;
}

PeerShares Small() {
  PeerShares s;
  s.connections = 8;
  s.connections_per_peer = 2;
  s.reserve_connections = 4;
  s.requests_per_peer = 3;
  s.request_bytes_per_peer = 1000;
  s.unread_bytes = 10'000;
  s.unread_bytes_per_peer = 4'000;
  return s;
}

TEST(PeerLimitsTest, OneUserPastItsShareLeavesRoomForAnother) {
  PeerAccounting a(Small());
  EXPECT_EQ(a.AdmitConnection(User(1000)).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(User(1000)).admission, Admission::kServe);
  ConnectionVerdict third = a.AdmitConnection(User(1000));
  EXPECT_EQ(third.admission, Admission::kReserve);
  EXPECT_EQ(third.reason, metrics::Refusal::kPeerConnections);
  EXPECT_EQ(third.why.code(), Code::kResourceExhausted);
  EXPECT_NE(third.why.message().find("uid 1000 already has 2 connections"), std::string::npos)
      << third.why.message();
  EXPECT_NE(third.why.message().find("max_connections_per_peer"), std::string::npos);
  // Another user, and the TCP clients, are served.
  EXPECT_EQ(a.AdmitConnection(User(1001)).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(Tcp("127.0.0.1")).admission, Admission::kServe);
  EXPECT_EQ(a.connections(), 4u);
  EXPECT_EQ(a.reserve_in_use(), 1u);
  // A place given back is a place taken again.
  a.ConnectionClosed(User(1000), Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(User(1000)).admission, Admission::kServe);
}

TEST(PeerLimitsTest, NoPeerTakesTheWholeReserve) {
  PeerAccounting a(Small());
  for (int i = 0; i < 2; i++) ASSERT_EQ(a.AdmitConnection(User(7)).admission, Admission::kServe);
  // Half the reserve (2 of 4) for the abuser, then refused at once.
  EXPECT_EQ(a.AdmitConnection(User(7)).admission, Admission::kReserve);
  EXPECT_EQ(a.AdmitConnection(User(7)).admission, Admission::kReserve);
  ConnectionVerdict refused = a.AdmitConnection(User(7));
  EXPECT_EQ(refused.admission, Admission::kRefuse);
  EXPECT_EQ(refused.reason, metrics::Refusal::kReserveFull);
  EXPECT_EQ(a.usage(User(7)).reserve, 2u);
  // Somebody else past their share still finds a reserve place (a /metrics scrape, a refusal).
  for (int i = 0; i < 2; i++) ASSERT_EQ(a.AdmitConnection(User(8)).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(User(8)).admission, Admission::kReserve);
  a.ConnectionClosed(User(7), Admission::kReserve);
  EXPECT_EQ(a.reserve_in_use(), 2u);
  a.ConnectionClosed(User(7), Admission::kRefuse);  // never counted: nothing to give back
  EXPECT_EQ(a.reserve_in_use(), 2u);
}

TEST(PeerLimitsTest, TheGlobalLimitStillBoundsTheSum) {
  PeerShares shares = Small();
  shares.connections = 3;
  PeerAccounting a(shares);
  EXPECT_EQ(a.AdmitConnection(User(1)).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(User(2)).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(User(3)).admission, Admission::kServe);
  ConnectionVerdict v = a.AdmitConnection(User(4));
  EXPECT_EQ(v.admission, Admission::kReserve);
  EXPECT_EQ(v.reason, metrics::Refusal::kConnections);
  EXPECT_NE(v.why.message().find("max_connections"), std::string::npos);
}

TEST(PeerLimitsTest, OutOfDescriptorsEveryConnectionGoesToTheReserve) {
  PeerAccounting a(Small());
  ConnectionVerdict v = a.AdmitConnection(User(1), /*out_of_descriptors=*/true);
  EXPECT_EQ(v.admission, Admission::kReserve);
  EXPECT_EQ(v.reason, metrics::Refusal::kOutOfDescriptors);
  EXPECT_NE(v.why.message().find("out of file descriptors"), std::string::npos);
  EXPECT_NE(v.why.message().find("LimitNOFILE"), std::string::npos);
  EXPECT_EQ(a.connections(), 0u);
}

TEST(PeerLimitsTest, AllLoopbackTcpClientsAreOnePeer) {
  PeerAccounting a(Small());
  EXPECT_EQ(a.AdmitConnection(Tcp("127.0.0.1")).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(Tcp("127.0.0.1")).admission, Admission::kServe);
  ConnectionVerdict v = a.AdmitConnection(Tcp("127.0.0.1"));
  EXPECT_EQ(v.admission, Admission::kReserve);
  EXPECT_NE(v.why.message().find("TCP 127.0.0.1"), std::string::npos) << v.why.message();
  EXPECT_EQ(a.AdmitConnection(Tcp("::1")).admission, Admission::kServe);
  EXPECT_EQ(a.AdmitConnection(User(0)).admission, Admission::kServe);
}

TEST(PeerLimitsTest, RequestsAndTheirBytesAreCountedPerPeer) {
  PeerAccounting a(Small());
  EXPECT_TRUE(a.AdmitRequest(User(1), 100).ok);
  EXPECT_TRUE(a.AdmitRequest(User(1), 100).ok);
  EXPECT_TRUE(a.AdmitRequest(User(1), 100).ok);
  PeerAccounting::RequestVerdict v = a.AdmitRequest(User(1), 1);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, metrics::Refusal::kPeerRequests);
  EXPECT_NE(v.why.message().find("max_requests_per_peer"), std::string::npos);
  EXPECT_TRUE(a.AdmitRequest(User(2), 1).ok);  // another user has a share of their own
  a.RequestAnswered(User(1), 100);
  EXPECT_EQ(a.usage(User(1)).requests, 2u);
  EXPECT_EQ(a.usage(User(1)).request_bytes, 200u);
  // Bytes: past the share is refused, but one request alone never is (the frame limit bounds it).
  v = a.AdmitRequest(User(1), 900);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, metrics::Refusal::kPeerRequestBytes);
  EXPECT_NE(v.why.message().find("max_queued_bytes_per_peer"), std::string::npos);
  a.RequestAnswered(User(1), 100);
  a.RequestAnswered(User(1), 100);
  EXPECT_EQ(a.peers(), 1u);  // user 1 holds nothing: forgotten
  EXPECT_TRUE(a.AdmitRequest(User(1), 5000).ok);
}

TEST(PeerLimitsTest, UnreadCutsOffTheBiggestOfAPeerOverItsShareThenTheBiggestOverall) {
  PeerAccounting a(Small());
  // uid 1 holds 5000 over three connections (share 4000): its biggest goes, the rest stay.
  std::vector<PeerAccounting::Unread> unread = {
      {1, User(1), 1000}, {2, User(1), 3000}, {3, User(1), 1000}, {4, User(2), 3500}};
  std::vector<PeerAccounting::CutOff> cut = a.OverUnread(unread);
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_EQ(cut[0].session, 2u);
  EXPECT_EQ(cut[0].why.code(), Code::kResourceExhausted);
  EXPECT_NE(cut[0].why.message().find("max_unread_reply_bytes_per_peer"), std::string::npos);
  // Each within its share, but all together over the total (10000): the biggest goes.
  unread = {{1, User(1), 3900}, {2, User(2), 3800}, {3, User(3), 3700}};
  cut = a.OverUnread(unread);
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_EQ(cut[0].session, 1u);
  // Within everything: nobody.
  EXPECT_TRUE(a.OverUnread({{1, User(1), 3000}, {2, User(2), 3000}}).empty());
}

}  // namespace
}  // namespace warmpool::supervisor
