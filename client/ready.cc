#include "client/ready.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <thread>

namespace warmpool::client {

namespace {

// The status, read for at most `left`; the socket reads without a limit again afterwards.
Result<v1::StatusReply> StatusWithin(Client& client, std::chrono::microseconds left) {
  const int64_t us = std::max<int64_t>(left.count(), 1000);
  timeval until{};
  until.tv_sec = us / 1000000;
  until.tv_usec = us % 1000000;
  setsockopt(client.fd(), SOL_SOCKET, SO_RCVTIMEO, &until, sizeof(until));
  Result<v1::StatusReply> answered = client.GetStatus();
  const timeval forever{};
  setsockopt(client.fd(), SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof(forever));
  return answered;
}

bool EveryWorkerIdle(const v1::StatusReply& status) {
  if (status.workers_size() == 0) return false;
  for (const auto& w : status.workers()) {
    if (w.state() != "idle") return false;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<Client>> ConnectWhenReady(const std::string& socket, const ReadyWait& wait) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait.wait_ms);
  std::string last = "no attempt made";
  while (true) {
    if (wait.still_starting) {
      if (Status s = wait.still_starting(); !s.ok()) return s;
    }
    Result<std::unique_ptr<Client>> connected = Client::Connect(socket);
    if (connected.ok()) {
      const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
      Result<v1::StatusReply> answered = StatusWithin(**connected, left);
      if (answered.ok()) {
        if (!wait.workers_idle || EveryWorkerIdle(*answered)) return connected;
        last = "it answers, but its workers are still starting";
      } else if (answered.status().code() != Code::kUnavailable) {
        return answered.status();
      } else {
        last = answered.status().message();
      }
    } else {
      last = connected.status().message();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Error(Code::kUnavailable, "no daemon was ready on {} within {} ms: {}", socket, wait.wait_ms, last);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace warmpool::client
