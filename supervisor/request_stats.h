// The shell's share of the segment's stats (shm/stats.h): requests naming a registered model, by
// kind and by the code they were answered with, and inference latency from the request's arrival
// to its reply being queued, on the monotonic nanosecond clock. (The core counts what it decides:
// loads, releases, crashes, queue wait.) Requests are remembered between the two by session and
// request id; a session that leaves takes its entries with it. Requests naming no registered
// model are not counted per model: a label per unknown name would let any client grow the
// metrics without bound.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "ipc/warmpool.pb.h"
#include "shm/model_index.h"
#include "shm/segment.h"

namespace warmpool::supervisor {

class RequestStats {
 public:
  explicit RequestStats(shm::SegmentView view) : view_(view) {}

  // resolve: the model a name stands for (a registered name or an alias), shm::kNil if none.
  void Received(uint64_t session, const v1::Envelope& request,
                const std::function<uint32_t(const std::string&)>& resolve, uint64_t now_ns);
  void Answered(uint64_t session, const v1::Envelope& reply, uint64_t now_ns);
  void SessionGone(uint64_t session);
  size_t pending() const;

 private:
  struct Pending {
    uint32_t model = 0;
    uint64_t generation = 0;  // of the model's stats record: a record reused meanwhile is not it
    shm::RequestKind kind = shm::RequestKind::kInfer;
    uint64_t received_ns = 0;
  };
  shm::SegmentView view_;
  std::unordered_map<uint64_t, std::unordered_map<uint64_t, Pending>> sessions_;
};

}  // namespace warmpool::supervisor
