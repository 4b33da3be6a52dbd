// Dynamic batching (worker/batching.cc): requests for one model that meet at a worker are computed
// in one engine call, and every request still gets its own rows back.
#include <algorithm>
#include <chrono>
#include <vector>

#include <fmt/format.h>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

class BatchingTest : public DaemonTest {};

struct Sent {
  uint64_t id;
  client::Matrix input;
};

// Pipelines `count` requests of 1 to 3 rows, each with its own input, on one connection; checks
// every reply against the reference and returns the batch_rows of each.
std::vector<uint32_t> PipelineAndCheck(client::Client& client, const std::string& model, const std::string& path,
                                       uint32_t cols, int count) {
  std::vector<Sent> sent;
  for (int i = 0; i < count; ++i) {
    client::Matrix input = RandomMatrix(1 + i % 3, cols, 100 + i);
    auto id = client.SendInfer(model, input);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return {};
    sent.push_back({*id, std::move(input)});
  }
  std::vector<uint32_t> batch_rows;
  for (const Sent& s : sent) {
    auto reply = client.Wait(s.id);
    EXPECT_TRUE(reply.ok() && reply->has_infer_reply()) << (reply.ok() ? reply->DebugString() : reply.status().ToString());
    if (!reply.ok() || !reply->has_infer_reply()) return {};
    auto output = client::FromTensor(reply->infer_reply().output());
    EXPECT_TRUE(output.ok());
    ExpectNear(ReferenceInfer(path, s.input), *output);
    EXPECT_GE(reply->infer_reply().batch_rows(), s.input.rows);
    batch_rows.push_back(reply->infer_reply().batch_rows());
  }
  return batch_rows;
}

TEST_F(BatchingTest, PipelinedRequestsShareEngineCallsAndEachGetsItsOwnRows) {
  std::string path = MakeModel("m", "24,96,7", "gelu");
  // A long delay, so that the worker surely waits for the requests behind the first. And the first
  // request held up in the engine for 100 ms: on a loaded machine a worker could otherwise answer
  // each request before the next one reached it, and none would ever meet another.
  StartDaemon("[pool]\nmax_batch_delay_us = 20000\n", {"--enable-fault-injection"});
  auto client = Connect();
  ASSERT_TRUE(client->Load("m").ok());
  ASSERT_TRUE(client->ArmFault(client::FaultSpec{"infer.mid", "delay:100", "m", 0, 1}).ok());
  std::vector<uint32_t> batch_rows = PipelineAndCheck(*client, "m", path, 24, 64);
  ASSERT_EQ(batch_rows.size(), 64u);
  uint32_t largest = 0;
  for (uint32_t rows : batch_rows) largest = std::max(largest, rows);
  EXPECT_GT(largest, 3u) << "no two requests were ever computed together";
  ExpectQuiescentAndValid();
}

TEST_F(BatchingTest, ALoneClientNeverWaitsAndBatchingCanBeTurnedOff) {
  std::string path = MakeModel("m", "24,96,7");
  MakeModel("off", "24,96,7");
  // The longest delay the config allows (1 s): a request that waited for company is then told from
  // one that was merely slow (a few ms, even sanitized on a loaded machine) by a margin no load
  // makes up. (That the supervisor sends a lone request with no delay is CoreTest's, exactly.)
  StartDaemon(fmt::format("[pool]\nmax_batch_delay_us = 1000000\n[[models]]\nname = \"off\"\npath = \"{}\"\n"
                          "max_batch_delay_us = 0\n",
                          models_dir_ + "/off.safetensors"));
  auto client = Connect();
  ASSERT_TRUE(client->Load("m").ok());
  ASSERT_TRUE(client->Load("off").ok());
  // One request at a time: nothing else is in flight, so none waits its second for company.
  for (int i = 0; i < 10; ++i) {
    client::Matrix input = RandomMatrix(2, 24, i);
    auto started = std::chrono::steady_clock::now();
    auto id = client->SendInfer("m", input);
    ASSERT_TRUE(id.ok());
    auto reply = client->Wait(*id);
    ASSERT_TRUE(reply.ok() && reply->has_infer_reply());
    EXPECT_EQ(reply->infer_reply().batch_rows(), 2u);
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(1)) << "a lone request waited for a batch";
  }
  // Batching off: pipelined requests are computed one by one.
  std::vector<uint32_t> batch_rows = PipelineAndCheck(*client, "off", models_dir_ + "/off.safetensors", 24, 32);
  ASSERT_EQ(batch_rows.size(), 32u);
  for (size_t i = 0; i < batch_rows.size(); ++i) EXPECT_EQ(batch_rows[i], 1 + i % 3);
}

}  // namespace
}  // namespace warmpool::testing
