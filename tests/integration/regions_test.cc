// Clients' shared-memory regions (InferRequest.input_region / output_region): large tensors travel
// as offsets into a memfd the client registered; the worker reads and writes them in place. Every
// malformed or hostile region gets a typed error and the daemon keeps serving.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/requests.h"
#include "ipc/socket_io.h"
#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;

class RegionsTest : public DaemonTest {
 protected:
  // Registers a region through the raw protocol, with whatever descriptor the test chooses.
  Result<v1::Envelope> RegisterRaw(client::Client& c, uint64_t bytes, std::vector<int> fds) {
    Result<uint64_t> id = c.Send(client::RegionRequest(bytes), fds);
    if (!id.ok()) return id.status();
    return c.Wait(*id);
  }
  size_t OpenDescriptors(pid_t pid) {
    size_t n = 0;
    for (auto it = fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd"); it != fs::directory_iterator(); ++it) n++;
    return n;
  }
};

void Put(client::SharedRegion& region, uint64_t offset, const client::Matrix& m) {
  std::memcpy(region.data() + offset, m.data.data(), m.data.size() * sizeof(float));
}

client::Matrix Get(const client::SharedRegion& region, uint64_t offset, uint32_t rows, uint32_t cols) {
  client::Matrix m{rows, cols, std::vector<float>(uint64_t{rows} * cols)};
  std::memcpy(m.data.data(), region.data() + offset, m.data.size() * sizeof(float));
  return m;
}

Code CodeOf(const Result<v1::Envelope>& reply) {
  if (!reply.ok()) return reply.status().code();
  return client::StatusOf(*reply).code();
}

TEST_F(RegionsTest, TensorsInARegionAreComputedInPlaceAndMatchTheReference) {
  std::string path = MakeModel("m", "64,256,48", "gelu");
  StartDaemon();
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  auto region = client::SharedRegion::Create(1 << 20);
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  ASSERT_TRUE(c->RegisterRegion(*region).ok());
  EXPECT_NE(region->id(), 0u);
  for (uint32_t rows : {1u, 7u, 33u}) {
    client::Matrix input = RandomMatrix(rows, 64, rows);
    const uint64_t in_offset = 4096 + 4 * rows;  // not page-aligned on purpose
    const uint64_t out_offset = 512 * 1024 + 8;
    Put(*region, in_offset, input);
    auto reply = c->InferInRegion("m", {region->id(), rows, 64, in_offset, out_offset, 48 * 4 * rows});
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_TRUE(reply->output_in_region());
    EXPECT_TRUE(reply->output().data().empty());
    EXPECT_EQ(reply->output().rows(), rows);
    EXPECT_EQ(reply->output().cols(), 48u);
    ExpectNear(ReferenceInfer(path, input), Get(*region, out_offset, rows, 48));
  }
  // An output slice too small: the output comes in the reply instead.
  client::Matrix input = RandomMatrix(3, 64, 9);
  Put(*region, 0, input);
  auto reply = c->InferInRegion("m", {region->id(), 3, 64, 0, 4096, 48 * 4 * 3 - 4});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_FALSE(reply->output_in_region());
  auto output = client::FromTensor(reply->output());
  ASSERT_TRUE(output.ok());
  ExpectNear(ReferenceInfer(path, input), *output);
  // Input in the region, output in the reply.
  reply = c->InferInRegion("m", {region->id(), 3, 64, 0, 0, 0});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_FALSE(reply->output_in_region());
  ExpectQuiescentAndValid();
}

TEST_F(RegionsTest, LargeInputsGoThroughTheClientsOwnRegion) {
  std::string path = MakeModel("m", "1024,16,2048");
  StartDaemon("[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  auto c = Connect();
  // 16 MiB through echo: above the client's threshold, so it travels in the client's region.
  client::Matrix big = RandomMatrix(4096, 1024, 3);
  auto echoed = c->Infer("echo", big);
  ASSERT_TRUE(echoed.ok()) << echoed.status().ToString();
  EXPECT_EQ(echoed->rows, big.rows);
  EXPECT_EQ(echoed->data, big.data);
  // A model whose output is twice its input: the first reply brings it in the frame, the region
  // grows, and the outputs are right either way.
  client::Matrix input = RandomMatrix(300, 1024, 4);
  for (int i = 0; i < 2; i++) {
    auto out = c->Infer("m", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(ReferenceInfer(path, input), *out);
  }
  // Workers keep a region mapped between requests, and let go of it when its client leaves, so
  // that its memory is freed.
  auto mapped_by_workers = [&] {
    int n = 0;
    for (pid_t pid : WorkerPids()) {
      std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
      for (std::string line; std::getline(maps, line);) n += line.find("warmpool-client-region") != std::string::npos;
    }
    return n;
  };
  EXPECT_GT(mapped_by_workers(), 0);
  c.reset();
  for (int i = 0; i < 100 && mapped_by_workers() > 0; i++) usleep(20000);
  EXPECT_EQ(mapped_by_workers(), 0) << "a worker still maps the region of a client that left";
  ExpectQuiescentAndValid();
}

TEST_F(RegionsTest, BadRegionsGetTypedErrorsAndTheDaemonKeepsServing) {
  StartDaemon("[[models]]\nname = \"echo\"\nengine = \"echo\"\n");
  auto c = Connect();
  const size_t descriptors_before = OpenDescriptors(DaemonPid());
  // No descriptor with the frame.
  EXPECT_EQ(CodeOf(RegisterRaw(*c, 4096, {})), Code::kInvalidArgument);
  // Not a memfd: a pipe.
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  EXPECT_EQ(CodeOf(RegisterRaw(*c, 4096, {pipe_fds[0]})), Code::kInvalidArgument);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  // A memfd that could shrink under a worker.
  int unsealed = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(unsealed, 8192), 0);
  auto refused = RegisterRaw(*c, 4096, {unsealed});
  EXPECT_EQ(CodeOf(refused), Code::kInvalidArgument);
  EXPECT_NE(client::StatusOf(*refused).message().find("F_SEAL_SHRINK"), std::string::npos);
  // Sealed against writes: outputs could not go there.
  int readonly = memfd_create("readonly", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(readonly, 8192), 0);
  ASSERT_EQ(fcntl(readonly, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_WRITE), 0);
  EXPECT_EQ(CodeOf(RegisterRaw(*c, 4096, {readonly})), Code::kInvalidArgument);
  // Smaller than it says.
  ASSERT_EQ(fcntl(unsealed, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(CodeOf(RegisterRaw(*c, 1 << 20, {unsealed})), Code::kInvalidArgument);
  auto good = RegisterRaw(*c, 8192, {unsealed});
  ASSERT_EQ(CodeOf(good), Code::kOk);
  const uint64_t id = good->region_reply().region();
  close(unsealed);
  close(readonly);

  // Slices out of bounds, misaligned, or of a shape that does not match.
  EXPECT_EQ(c->InferInRegion("echo", {id, 3, 1024, 0, 0, 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->InferInRegion("echo", {id, 1, 4, 2, 0, 0}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->InferInRegion("echo", {id, 1, 4, 0, 8190, 16}).status().code(), Code::kInvalidArgument);
  v1::Envelope wrong_shape = client::InferInRegionRequest("echo", {id, 2, 4, 0, 0, 0});
  wrong_shape.mutable_infer()->mutable_input_region()->set_bytes(12);
  EXPECT_EQ(CodeOf(c->Call(wrong_shape)), Code::kInvalidArgument);
  // Another connection cannot name this one's region.
  auto other = Connect();
  EXPECT_EQ(other->InferInRegion("echo", {id, 1, 4, 0, 16, 16}).status().code(), Code::kFailedPrecondition);
  // A well-formed one works; after removal the id is gone.
  auto ok = c->InferInRegion("echo", {id, 1, 4, 0, 16, 16});
  EXPECT_TRUE(ok.ok() && ok->output_in_region()) << ok.status().ToString();
  ASSERT_EQ(CodeOf(c->Call(client::RegionRemoveRequest(id))), Code::kOk);
  EXPECT_EQ(c->InferInRegion("echo", {id, 1, 4, 0, 16, 16}).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(CodeOf(c->Call(client::RegionRemoveRequest(id))), Code::kNotFound);

  // At most kMaxRegionsPerConnection per connection.
  std::vector<client::SharedRegion> regions;
  Status last;
  for (int i = 0; i < 20 && last.ok(); i++) {
    auto r = client::SharedRegion::Create(4096);
    ASSERT_TRUE(r.ok());
    last = c->RegisterRegion(*r);
    regions.push_back(std::move(*r));
  }
  EXPECT_EQ(last.code(), Code::kResourceExhausted) << last.ToString();

  // Descriptors sent with frames that do not ask for any are closed, and the connection serves.
  int stray = memfd_create("stray", MFD_CLOEXEC);
  for (int i = 0; i < 3; i++) {
    auto id2 = c->Send(client::StatusRequest(), {stray});
    ASSERT_TRUE(id2.ok());
    EXPECT_EQ(CodeOf(c->Wait(*id2)), Code::kOk);
  }
  close(stray);

  // Everything the connections held goes with them.
  c.reset();
  other.reset();
  regions.clear();
  auto d = Connect();
  ASSERT_TRUE(d->GetStatus().ok());
  for (int i = 0; i < 100 && OpenDescriptors(DaemonPid()) > descriptors_before + 1; i++) usleep(20000);
  EXPECT_LE(OpenDescriptors(DaemonPid()), descriptors_before + 1) << "the daemon kept descriptors of closed connections";
  auto echoed = d->Infer("echo", RandomMatrix(2, 3, 1));
  EXPECT_TRUE(echoed.ok());
  ExpectQuiescentAndValid();
}

TEST_F(RegionsTest, ARequestInARegionIsRetriedWhenItsWorkerDies) {
  std::string path = MakeModel("m", "32,64,16");
  StartDaemon("[recovery]\nrespawn_min_ms = 10\n", {"--enable-fault-injection"});
  auto c = Connect();
  ASSERT_TRUE(c->Load("m").ok());
  auto region = client::SharedRegion::Create(1 << 16);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(c->RegisterRegion(*region).ok());
  client::Matrix input = RandomMatrix(5, 32, 2);
  Put(*region, 0, input);
  ASSERT_EQ(Cli({"fault", "arm", "infer.mid", "kill", "--model", "m"}), 0);
  auto reply = c->InferInRegion("m", {region->id(), 5, 32, 0, 8192, 16 * 4 * 5});
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_TRUE(reply->output_in_region());
  ExpectNear(ReferenceInfer(path, input), Get(*region, 8192, 5, 16));
  ExpectQuiescentAndValid();
}

}  // namespace
}  // namespace warmpool::testing
