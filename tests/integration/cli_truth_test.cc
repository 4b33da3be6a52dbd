// What `warmpool` prints is what the daemon did: the same three sizes under the same names in
// every table and document, a PIN column and a pinned model without a countdown, what a load did
// to replicas, and refusals that name what owns a model.
#include <nlohmann/json.hpp>

#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

using nlohmann::json;

std::string FirstLine(const std::string& text) { return text.substr(0, text.find('\n')); }

// The line of a table that starts with the model's name.
std::string Row(const std::string& table, const std::string& name) {
  size_t at = 0;
  while (at < table.size()) {
    size_t end = table.find('\n', at);
    std::string line = table.substr(at, end - at);
    if (line.rfind(name + " ", 0) == 0) return line;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

TEST_F(DaemonTest, TablesAndDocumentsNameTheSameThreeSizes) {
  MakeModel("m", "16,32,8");
  StartDaemon();
  std::string out, err;
  ASSERT_EQ(Cli({"load", "m", "--keep-alive", "10m"}, &out, &err), 0) << err;
  EXPECT_TRUE(Contains(out, "m ready in ")) << out;
  EXPECT_TRUE(Contains(out, ": 1 replica; ")) << out;

  ASSERT_EQ(Cli({"models", "--json"}, &out, &err), 0) << err;
  json model = json::parse(out)[0];
  ASSERT_EQ(Cli({"ps", "--json"}, &out, &err), 0) << err;
  json ps = json::parse(out)[0];
  for (const char* key : {"weight_bytes", "workspace_bytes", "total_bytes"}) {
    EXPECT_EQ(model[key], ps[key]) << key << ": one model, one size\n" << model.dump() << "\n" << ps.dump();
  }
  EXPECT_EQ(ps["total_bytes"], ps["weight_bytes"].get<uint64_t>() + ps["workspace_bytes"].get<uint64_t>());
  EXPECT_GT(ps["workspace_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(ps["total_bytes"], AccountedBytes(models_dir_ + "/m.safetensors"));

  ASSERT_EQ(Cli({"models"}, &out, &err), 0) << err;
  const std::string models_header = FirstLine(out);
  ASSERT_EQ(Cli({"ps"}, &out, &err), 0) << err;
  const std::string ps_table = out;
  for (const std::string& header : {models_header, FirstLine(ps_table)}) {
    for (const char* column : {"WEIGHTS", "WORKSPACE", "TOTAL", "PIN"}) {
      EXPECT_TRUE(Contains(header, column)) << column << " missing from: " << header;
    }
    EXPECT_FALSE(Contains(header, "SIZE")) << header;
  }
  EXPECT_TRUE(Contains(Row(ps_table, "m"), "ready ")) << ps_table;
  EXPECT_FALSE(Contains(FirstLine(ps_table), "REASON")) << "no failed model, no reason column: " << ps_table;

  // A pinned model shows it, and no countdown (it never expires).
  ASSERT_EQ(Cli({"pin", "m"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"ps"}, &out, &err), 0) << err;
  EXPECT_TRUE(Contains(Row(out, "m"), "never (pinned)")) << out;
  ASSERT_EQ(Cli({"ps", "--json"}, &out, &err), 0) << err;
  EXPECT_TRUE(json::parse(out)[0]["expires_in"].is_null()) << out;
}

TEST_F(DaemonTest, LoadSaysWhatItDidToReplicas) {
  MakeModel("m", "16,32,8");
  StartDaemon();  // two workers on the one device
  std::string out, err;
  ASSERT_EQ(Cli({"load", "m"}, &out, &err), 0) << err;
  ASSERT_EQ(Cli({"load", "m"}, &out, &err), 0) << err;
  EXPECT_TRUE(Contains(out, "m is already loaded: 1 replica;")) << out;
  ASSERT_EQ(Cli({"load", "m", "--replicas", "5"}, &out, &err), 0) << err;
  EXPECT_TRUE(Contains(out, "m was already loaded: 2 replicas now, was 1")) << out;
  EXPECT_TRUE(Contains(out, "replicas: 2 of 5 asked for: at most 2")) << out;
  EXPECT_TRUE(Contains(out, "workers_per_device = 2")) << out;
  EXPECT_FALSE(Contains(out, "evicted")) << out;
}

TEST_F(DaemonTest, ReRegisteringAModelOfTheModelsDirectoryNamesTheDirectory) {
  MakeModel("m", "8,4");
  std::string other = MakeModel("other", "8,4", "relu", "f32", 2);
  StartDaemon();
  std::string out, err;
  EXPECT_EQ(Cli({"register", "m", other}, &out, &err), 1);
  EXPECT_TRUE(Contains(err, "model \"m\" comes from the models directory (" + models_dir_ + "/m.safetensors)"))
      << err;
  EXPECT_FALSE(Contains(err, "configuration")) << err;
}

}  // namespace
}  // namespace warmpool::testing
