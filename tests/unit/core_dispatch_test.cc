// The core's handling of inference requests on their way to workers: clients' shared-memory
// regions (supervisor/core/regions.cc) and when a request may wait to be batched (dispatch.cc).
#include <algorithm>

#include "tests/unit/core_rig.h"

namespace warmpool::supervisor::testing {
namespace {

// Clients' regions: the core keeps each memfd for its connection, sends it with every request that
// names it (a retry too), and closes it when the client removes it or leaves; a request whose
// region went away while it waited fails instead of reaching a worker with nothing.
TEST(CoreTest, ARegionTravelsWithItsRequestsAndIsClosedWithItsConnection) {
  CoreRig rig(CoreRig::SmallConfig());
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100);
  rig.Forget();
  v1::Envelope region;
  region.mutable_region()->set_bytes(4096);
  rig.Request(7, region, /*admin=*/false, /*handle=*/500);
  std::vector<v1::Envelope> replies = rig.Replies(7);
  ASSERT_EQ(replies.size(), 1u);
  ASSERT_TRUE(replies[0].has_region_reply()) << replies[0].DebugString();
  const uint64_t id = replies[0].region_reply().region();
  // A refused region is closed at once.
  rig.Request(7, region, false, 501, Error(Code::kInvalidArgument, "not a memfd"));
  EXPECT_EQ(rig.Replies(7)[0].error().code(), v1::INVALID_ARGUMENT);
  EXPECT_EQ(rig.Closed(), std::vector<int>{501});
  rig.Forget();

  auto infer_in_region = [&](uint64_t session, uint64_t offset) {
    v1::Envelope e;
    v1::InferRequest* r = e.mutable_infer();
    r->set_model("m");
    r->mutable_input()->set_rows(1);
    r->mutable_input()->set_cols(4);
    r->mutable_input_region()->set_region(id);
    r->mutable_input_region()->set_offset(offset);
    r->mutable_input_region()->set_bytes(16);
    r->mutable_output_region()->set_region(id);
    r->mutable_output_region()->set_offset(offset + 16);
    r->mutable_output_region()->set_bytes(16);
    return rig.Request(session, e, false);
  };
  // Past the region's end, and another connection's: refused before any worker sees them.
  infer_in_region(7, 4096 - 16);
  EXPECT_EQ(rig.Replies(7)[0].error().code(), v1::INVALID_ARGUMENT);
  infer_in_region(8, 0);
  EXPECT_EQ(rig.Replies(8)[0].error().code(), v1::FAILED_PRECONDITION);

  infer_in_region(7, 0);
  auto sent = rig.SentWithHandles(0);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].second, (std::vector<int>{500, 500})) << "input's region, then output's";
  EXPECT_FALSE(sent[0].first.infer().batch()) << "tensors in regions run alone";
  EXPECT_EQ(sent[0].first.infer().input_region().offset(), 0u);
  // Its worker dies: the retry carries the region again.
  const uint64_t job = sent[0].first.infer().job();
  rig.Down(0, {job});
  // (on worker 1, once the weights are attached there, or on worker 0 back up)
  rig.Advance(200);
  rig.Up(0);
  for (uint32_t slot : {0u, 1u}) {
    for (auto& [message, handles] : rig.SentWithHandles(slot)) {
      if (message.has_attach()) rig.Reply(slot, CoreRig::LoadDone(message.attach().job(), m));
    }
  }
  std::vector<std::vector<int>> retried;
  for (uint32_t slot : {0u, 1u}) {
    for (auto& [message, handles] : rig.SentWithHandles(slot)) {
      if (message.has_infer()) retried.push_back(handles);
    }
  }
  ASSERT_EQ(retried.size(), 1u);
  EXPECT_EQ(retried[0], (std::vector<int>{500, 500}));
  EXPECT_TRUE(rig.Closed().empty()) << "the region stays while the connection does";
  rig.Forget();

  // Removed: closed, and a request naming it afterwards fails.
  v1::Envelope remove;
  remove.mutable_region()->set_remove(id);
  rig.Request(7, remove, false);
  EXPECT_TRUE(rig.Replies(7).back().region_reply().removed());
  EXPECT_EQ(rig.Closed(), std::vector<int>{500});
  for (uint32_t slot : {0u, 1u}) {  // workers that mapped it unmap it
    std::vector<v1::WorkerEnvelope> told = rig.Sent(slot);
    ASSERT_EQ(told.size(), 1u);
    ASSERT_EQ(told[0].regions_gone().regions_size(), 1);
    EXPECT_EQ(told[0].regions_gone().regions(0), id);
  }
  rig.Forget();
  infer_in_region(7, 0);
  EXPECT_EQ(rig.Replies(7).back().error().code(), v1::FAILED_PRECONDITION);

  // Regions over all connections are bounded: each holds one of the daemon's descriptors.
  for (uint32_t i = 0; i < kMaxRegions; i++) rig.Request(1000 + i / kMaxRegionsPerConnection, region, false, 10000 + i);
  rig.Forget();
  rig.Request(5000, region, false, 700);
  EXPECT_EQ(rig.Replies(5000)[0].error().code(), v1::RESOURCE_EXHAUSTED);
  EXPECT_EQ(rig.Closed(), std::vector<int>{700});
  rig.Handle(event::ClientGone{1000});  // one connection's go back
  rig.Forget();
  rig.Request(5000, region, false, 701);
  EXPECT_TRUE(rig.Replies(5000)[0].has_region_reply());
  rig.Forget();

  // A connection that leaves takes its regions with it.
  rig.Request(9, region, false, 600);
  rig.Request(9, region, false, 601);
  rig.Forget();
  rig.Handle(event::ClientGone{9});
  std::vector<int> closed = rig.Closed();
  std::sort(closed.begin(), closed.end());
  EXPECT_EQ(closed, (std::vector<int>{600, 601}));
}

// Dynamic batching waits for company only when it can come: a lone request never waits, and a
// request that fills its worker's window does not either (nothing more is sent to that worker
// before it answers; the worker stops gathering at such a request). Pipelined clients paid the
// full delay on every batch before.
TEST(CoreTest, ABatchWaitsOnlyForCompanyThatCanStillCome) {
  Config config = CoreRig::SmallConfig();
  config.max_batch_delay_us = 500;
  config.max_inflight = 64;
  CoreRig rig(config);
  ModelEntry m = Entry("m", 100, 10);
  rig.Start({m});
  rig.Up(0);
  rig.Up(1);
  rig.Loaded(0, m, 100);
  rig.Forget();
  std::vector<uint32_t> delays;
  for (uint32_t i = 0; i < kWorkerWindowJobs + 4; ++i) {
    rig.Infer(7, "m");
    for (const v1::WorkerEnvelope& w : rig.Sent(0)) {
      if (w.has_infer()) delays.push_back(w.infer().batch_delay_us());
    }
  }
  ASSERT_EQ(delays.size(), kWorkerWindowJobs) << "the window bounds what the worker is sent";
  EXPECT_EQ(delays.front(), 0u) << "a lone request never waits";
  for (size_t i = 1; i + 1 < delays.size(); ++i) EXPECT_EQ(delays[i], 500u) << "request " << i;
  EXPECT_EQ(delays.back(), 0u) << "the request that fills the window waits for nobody";
}

}  // namespace
}  // namespace warmpool::supervisor::testing
