// Engine plugins end to end: the sample scale plugin loaded by workers from [daemon] engine_dir
// (load, infer, replicas attaching the shared weights, park and unpark, a worker crash), and the
// models the supervisor refuses at registration (an engine that is not there, a symlink leading out
// of engine_dir) or that workers refuse at load (a plugin without the entry point).
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "engines/safetensors.h"
#include "tests/integration/daemon_fixture.h"

namespace warmpool::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class PluginTest : public DaemonTest {
 protected:
  // engine_dir with scale.so in it, both as an operator would install them.
  std::string EngineDir() {
    std::string dir = dir_ + "/engines";
    fs::create_directories(dir);
    chmod(dir.c_str(), 0755);
    Install(WARMPOOL_SCALE_PLUGIN, dir + "/scale.so");
    return dir;
  }
  static void Install(const std::string& from, const std::string& to) {
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    chmod(to.c_str(), 0755);
  }
  // A scale model: one F32 tensor "scale" of shape [n] (or [] when scalar), its engine named in
  // the metadata unless engine is empty.
  static std::string WriteScaleModel(const std::string& path, const std::vector<float>& scale,
                                     bool scalar = false, const std::string& engine = "scale") {
    fs::create_directories(fs::path(path).parent_path());
    safetensors::TensorToWrite tensor{"scale", safetensors::DType::F32,
                                      scalar ? std::vector<uint64_t>{} : std::vector<uint64_t>{scale.size()},
                                      std::vector<uint8_t>(scale.size() * sizeof(float))};
    std::memcpy(tensor.data.data(), scale.data(), tensor.data.size());
    std::map<std::string, std::string> metadata;
    if (!engine.empty()) metadata["engine"] = engine;
    Status written = safetensors::WriteFile(path, {tensor}, metadata);
    EXPECT_TRUE(written.ok()) << written.ToString();
    return path;
  }
  static client::Matrix Scaled(const client::Matrix& input, const std::vector<float>& scale) {
    client::Matrix out = input;
    for (uint32_t r = 0; r < input.rows; r++) {
      for (uint32_t c = 0; c < input.cols; c++) {
        out.data[r * input.cols + c] *= scale.size() == 1 ? scale[0] : scale[c];
      }
    }
    return out;
  }
  std::map<std::string, json> Models() {
    std::string out, err;
    EXPECT_EQ(Cli({"models", "--json"}, &out, &err), 0) << err;
    std::map<std::string, json> by_name;
    for (const json& m : json::parse(out)) by_name[m["name"].get<std::string>()] = m;
    return by_name;
  }
};

TEST_F(PluginTest, ScalePluginLoadsInfersSharesParksAndSurvivesAWorkerCrash) {
  const std::vector<float> scale = {1.0f, -2.0f, 0.5f, 4.0f, 0.0f, 3.0f};
  std::string path = WriteScaleModel(dir_ + "/plugin-models/scaler.safetensors", scale);
  // A file in the models directory names its engine in its metadata.
  WriteScaleModel(models_dir_ + "/tripler.safetensors", {3.0f}, /*scalar=*/true);
  StartDaemon("engine_dir = \"" + EngineDir() + "\"\n"
              "[pool]\npark_budget = \"1MiB\"\n"
              "[[models]]\nname = \"scaler\"\nengine = \"scale\"\npath = \"" + path + "\"\n");

  std::map<std::string, json> models = Models();
  ASSERT_EQ(models.count("scaler"), 1u);
  EXPECT_EQ(models["scaler"]["engine"], "scale");
  EXPECT_EQ(models["scaler"]["state"], "registered") << models["scaler"].dump();
  EXPECT_EQ(models["scaler"]["bytes"], scale.size() * sizeof(float));
  ASSERT_EQ(models.count("tripler"), 1u);
  EXPECT_EQ(models["tripler"]["engine"], "scale");
  EXPECT_EQ(models["tripler"]["state"], "registered") << models["tripler"].dump();

  auto client = Connect();
  client::Matrix input = RandomMatrix(5, 6, 11);
  Result<client::Matrix> out = client->Infer("scaler", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(Scaled(input, scale), *out, 0.0f);
  // Weights only: the plugin reports no workspace, and the account holds exactly what it reported.
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), scale.size() * sizeof(float));

  client::Matrix wide = RandomMatrix(2, 9, 12);
  Result<client::Matrix> tripled = client->Infer("tripler", wide);
  ASSERT_TRUE(tripled.ok()) << tripled.status().ToString();
  ExpectNear(Scaled(wide, {3.0f}), *tripled, 0.0f);

  // The plugin's own input check comes back as the request's error.
  Result<client::Matrix> narrow = client->Infer("scaler", RandomMatrix(1, 4, 13));
  EXPECT_EQ(narrow.status().code(), Code::kInvalidArgument);
  EXPECT_NE(narrow.status().message().find("expects 6"), std::string::npos) << narrow.status().message();

  // Park and unpark: the plugin attaches a copy of its weights, without the file.
  std::string cli_out, cli_err;
  ASSERT_EQ(Cli({"unload", "--park", "scaler"}, &cli_out, &cli_err), 0) << cli_err;
  fs::remove(path);
  out = client->Infer("scaler", input);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(Scaled(input, scale), *out, 0.0f);

  // Two replicas from one copy; a replica's worker dies and the survivor keeps serving.
  ASSERT_EQ(Cli({"load", "scaler", "--replicas", "2"}, &cli_out, &cli_err), 0) << cli_err;
  auto replicas = [&] {
    auto ps = client->Ps();
    if (!ps.ok()) return 0u;
    for (const auto& m : ps->models()) {
      if (m.name() == "scaler") return m.replicas();
    }
    return 0u;
  };
  for (int i = 0; i < 300 && replicas() != 2; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(replicas(), 2u);
  kill(client->GetStatus()->workers(0).pid(), SIGKILL);
  for (int i = 0; i < 20; i++) {
    out = client->Infer("scaler", input);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ExpectNear(Scaled(input, scale), *out, 0.0f);
  }
  // The respawned worker attaches the shared weights again (the file is gone: no load possible).
  for (int i = 0; i < 300 && replicas() != 2; i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(replicas(), 2u);
  EXPECT_NE(DaemonLog().find("weights attached"), std::string::npos);
  ASSERT_TRUE(client->Unload("scaler").ok());
  ASSERT_TRUE(client->Unload("tripler").ok());
  EXPECT_EQ(client->GetStatus()->devices(0).used_bytes(), 0u);
}

TEST_F(PluginTest, MissingPluginAndSymlinkOutOfTheEngineDirAreRegisteredAsFailed) {
  std::string engines = EngineDir();
  std::string outside = dir_ + "/outside";
  fs::create_directories(outside);
  chmod(outside.c_str(), 0755);
  Install(WARMPOOL_SCALE_PLUGIN, outside + "/evil.so");
  fs::create_symlink(outside + "/evil.so", engines + "/evil.so");
  std::string path = WriteScaleModel(dir_ + "/plugin-models/m.safetensors", {2.0f}, /*scalar=*/true);
  StartDaemon("engine_dir = \"" + engines + "\"\n"
              "[[models]]\nname = \"ghost\"\nengine = \"ghost\"\npath = \"" + path + "\"\n"
              "[[models]]\nname = \"evil\"\nengine = \"evil\"\npath = \"" + path + "\"\n"
              "[[models]]\nname = \"upper\"\nengine = \"Scale\"\npath = \"" + path + "\"\n"
              "[[models]]\nname = \"fine\"\nengine = \"scale\"\npath = \"" + path + "\"\n");

  std::map<std::string, json> models = Models();
  EXPECT_EQ(models["ghost"]["state"], "failed");
  EXPECT_EQ(models["ghost"]["error"],
            "model \"ghost\": engine \"ghost\" not found: no built-in engine of that name (built in: "
            "dense, echo, transformer) and no ghost.so in " + fs::canonical(engines).string());
  EXPECT_EQ(models["evil"]["state"], "failed");
  EXPECT_NE(models["evil"]["error"].get<std::string>().find("outside the engine directory"), std::string::npos)
      << models["evil"].dump();
  EXPECT_EQ(models["upper"]["state"], "failed");
  EXPECT_NE(models["upper"]["error"].get<std::string>().find("lower-case"), std::string::npos)
      << models["upper"].dump();
  EXPECT_EQ(models["fine"]["state"], "registered") << models["fine"].dump();

  std::string out, err;
  EXPECT_EQ(Cli({"infer", "ghost", "--random", "1"}, &out, &err), 1);
  EXPECT_NE(err.find("ghost.so"), std::string::npos) << err;
  EXPECT_EQ(Cli({"load", "evil"}, &out, &err), 1);
  EXPECT_NE(err.find("outside the engine directory"), std::string::npos) << err;
  // The refused ones cost nothing: the good plugin model next to them serves.
  ASSERT_EQ(Cli({"infer", "fine", "--input", "-", "--json"}, &out, &err, "[[1, -2.5]]"), 0) << err;
  EXPECT_EQ(json::parse(out), json::parse("[[2, -5]]"));
}

TEST_F(PluginTest, PluginThatWorkersRefuseFailsItsModelWithTheReason) {
  std::string engines = EngineDir();
  Install(std::string(WARMPOOL_BROKEN_PLUGIN_DIR) + "/nosym.so", engines + "/nosym.so");
  std::string path = WriteScaleModel(dir_ + "/plugin-models/m.safetensors", {2.0f}, /*scalar=*/true, "");
  StartDaemon("engine_dir = \"" + engines + "\"\n"
              "[[models]]\nname = \"broken\"\nengine = \"nosym\"\npath = \"" + path + "\"\n");
  // The supervisor only checks the file, which is fine: the model registers.
  EXPECT_EQ(Models()["broken"]["state"], "registered");
  std::string out, err;
  EXPECT_EQ(Cli({"load", "broken"}, &out, &err), 1);
  EXPECT_NE(err.find("does not export warmpool_engine()"), std::string::npos) << err;
  EXPECT_EQ(Models()["broken"]["state"], "failed");

  // A failed plugin is not remembered as failed: a retry checks and loads the file again (here
  // replaced by one that fails differently).
  Install(std::string(WARMPOOL_BROKEN_PLUGIN_DIR) + "/oldabi.so", engines + "/nosym.so");
  EXPECT_EQ(Cli({"load", "broken"}, &out, &err), 1);
  EXPECT_NE(err.find("ABI version 1"), std::string::npos) << err;
}

}  // namespace
}  // namespace warmpool::testing
