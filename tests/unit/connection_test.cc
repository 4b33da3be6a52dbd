// The evented connection with descriptors in flight: a frame queued behind others keeps the
// descriptors it names alive until it is written, whatever the sender does with its own.
#include "ipc/connection.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ipc/socket_io.h"

namespace warmpool::ipc {
namespace {

std::string RawFrame(const std::string& body) {
  std::string frame(4, '\0');
  uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; i++) frame[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return frame + body;
}

TEST(ConnectionTest, ADescriptorClosedByTheSenderStillGoesWithItsQueuedFrame) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  bool closed = false;
  Status why;
  Connection* c = Connection::Open(&loop, sv[0], {}, [](std::string_view) {},
                                   [&](const Status& s) {
                                     closed = true;
                                     why = s;
                                   });
  ASSERT_NE(c, nullptr);
  // Frames queue up: the peer reads nothing yet.
  std::string filler(64 * 1024, 'x');
  size_t sent = 0;
  for (int i = 0; i < 8 && c->pending_write_bytes() == 0; i++) {
    c->Send(RawFrame(filler));
    sent += 4 + filler.size();
  }
  ASSERT_GT(c->pending_write_bytes(), 0u) << "the frames did not queue";
  int region = memfd_create("payload", MFD_CLOEXEC);
  ASSERT_GE(region, 0);
  ASSERT_EQ(write(region, "weights", 7), 7);
  c->Send(RawFrame("with the region"), {region});
  sent += 4 + 15;
  // The sender lets go of its descriptor at once, and the number goes to something else.
  ASSERT_EQ(close(region), 0);
  int other = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(other, 0);

  size_t received = 0;
  std::vector<int> fds;
  std::vector<char> buffer(64 * 1024);
  for (int round = 0; round < 10000 && received < sent && !closed; round++) {
    uv_run(&loop, UV_RUN_NOWAIT);
    ssize_t n = RecvWithFds(sv[1], buffer.data(), buffer.size(), fds);
    if (n > 0) received += static_cast<size_t>(n);
  }
  EXPECT_FALSE(closed) << "the connection failed: " << why.ToString();
  EXPECT_EQ(received, sent);
  ASSERT_EQ(fds.size(), 1u);
  char content[8] = {};
  EXPECT_EQ(pread(fds[0], content, 7, 0), 7);
  EXPECT_STREQ(content, "weights") << "the frame carried another descriptor than the one it named";
  for (int fd : fds) close(fd);
  close(other);
  c->Close(OkStatus());
  uv_run(&loop, UV_RUN_DEFAULT);
  close(sv[1]);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(ConnectionTest, DescriptorsOfFramesNeverWrittenAreClosed) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  Connection* c = Connection::Open(&loop, sv[0], {}, [](std::string_view) {}, [](const Status&) {});
  std::string filler(64 * 1024, 'x');
  for (int i = 0; i < 8 && c->pending_write_bytes() == 0; i++) c->Send(RawFrame(filler));
  int region = memfd_create("payload", MFD_CLOEXEC);
  c->Send(RawFrame("never written"), {region});
  close(region);
  // Count open descriptors before and after the connection drops its queue.
  auto open_fds = [] {
    int n = 0;
    for (int fd = 0; fd < 1024; fd++) n += fcntl(fd, F_GETFD) != -1;
    return n;
  };
  int before = open_fds();
  c->Close(OkStatus());
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(open_fds(), before - 2) << "the socket and the frame's duplicate are both closed";
  close(sv[1]);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

TEST(ConnectionTest, WhatAPeerWroteBeforeItDiedIsReadEvenWhenAWriteFindsItGone) {
  // A worker writes its last reply (or its fault report) and dies; the supervisor writes to it
  // before its loop has read that: the write fails, and the reply must still be handed on.
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  std::vector<std::string> frames;
  bool closed = false;
  Connection* c = Connection::Open(
      &loop, sv[0], {}, [&](std::string_view body) {
        EXPECT_FALSE(closed) << "a frame after the close";
        frames.emplace_back(body);
      },
      [&](const Status&) { closed = true; });
  std::string last = RawFrame("last words");
  ASSERT_EQ(write(sv[1], last.data(), last.size()), static_cast<ssize_t>(last.size()));
  close(sv[1]);
  c->Send(RawFrame("too late"));  // EPIPE, before the loop ever polled
  EXPECT_TRUE(closed);
  ASSERT_EQ(frames.size(), 1u);
  EXPECT_EQ(frames[0], "last words");
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
}

// With a WriteBatcher, frames sent during one turn of the loop go out together at its end, in
// order, each descriptor with the first byte of its own frame (a frame carrying one starts its
// own sendmsg).
TEST(ConnectionTest, BatchedWritesKeepOrderAndDescriptorsWithTheirFrames) {
  uv_loop_t loop;
  ASSERT_EQ(uv_loop_init(&loop), 0);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
  auto batcher = std::make_unique<WriteBatcher>(&loop);
  Connection::Options options;
  options.batcher = batcher.get();
  Connection* c = Connection::Open(&loop, sv[0], options, [](std::string_view) {}, [](const Status&) {});
  ASSERT_NE(c, nullptr);
  std::string expected;
  for (int i = 0; i < 100; i++) {  // more frames than one sendmsg gathers
    std::string body = "frame " + std::to_string(i);
    if (i == 50) {
      int region = memfd_create("payload", MFD_CLOEXEC);
      ASSERT_EQ(write(region, "fifty", 5), 5);
      c->Send(RawFrame(body), {region});
      close(region);
    } else {
      c->Send(RawFrame(body));
    }
    expected += RawFrame(body);
  }
  char probe;
  EXPECT_EQ(recv(sv[1], &probe, 1, MSG_DONTWAIT | MSG_PEEK), -1) << "written before the turn ended";
  uv_run(&loop, UV_RUN_NOWAIT);
  // Read it all back; the descriptor must arrive with the bytes of frame 50.
  std::string got;
  std::vector<int> fds;
  size_t read_from = std::string::npos, read_to = 0;  // the read that brought the descriptor
  while (got.size() < expected.size()) {
    char buffer[65536];
    size_t before_fds = fds.size();
    ssize_t n = RecvWithFds(sv[1], buffer, sizeof(buffer), fds);
    ASSERT_GT(n, 0);
    if (fds.size() > before_fds) {
      read_from = got.size();
      read_to = got.size() + static_cast<size_t>(n);
    }
    got.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_EQ(got, expected);
  ASSERT_EQ(fds.size(), 1u);
  // A read may bring earlier frames' bytes too, never a descriptor before its frame's first byte.
  const size_t frame50 = expected.find(RawFrame("frame 50"));
  EXPECT_LE(read_from, frame50);
  EXPECT_GT(read_to, frame50) << "the descriptor came before its frame";
  char content[8] = {};
  EXPECT_EQ(pread(fds[0], content, 5, 0), 5);
  EXPECT_STREQ(content, "fifty");
  close(fds[0]);
  c->Close(OkStatus());
  batcher.reset();
  uv_run(&loop, UV_RUN_DEFAULT);
  EXPECT_EQ(uv_loop_close(&loop), 0);
  close(sv[1]);
}

}  // namespace
}  // namespace warmpool::ipc
