// Engine plugins: the name and file checks (CheckEngine, what the supervisor runs), loading
// (ResolveEngine, what workers run), the broken plugins it must refuse, and the sample scale plugin
// driven through every entry point of the ABI with the host memory service.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/plugin_loader.h"
#include "engines/safetensors.h"
#include "tests/text.h"

namespace warmpool {
namespace {

namespace fs = std::filesystem;

std::string ScalePlugin() { return WARMPOOL_SCALE_PLUGIN; }
std::string BrokenPlugin(const std::string& stem) { return std::string(WARMPOOL_BROKEN_PLUGIN_DIR) + "/" + stem + ".so"; }

using ::warmpool::testing::Contains;

class PluginLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/plugin_loader_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    dir_ = root_ + "/engines";
    fs::create_directory(dir_);
    chmod(dir_.c_str(), 0755);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  // Copies a built plugin into dir as <stem>.so, mode 0755.
  std::string Install(const std::string& from, const std::string& stem, const std::string& dir = "") {
    std::string to = (dir.empty() ? dir_ : dir) + "/" + stem + ".so";
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    chmod(to.c_str(), 0755);
    return to;
  }

  std::string root_;
  std::string dir_;
};

TEST(EngineName, OnlyLowerCaseLettersDigitsUnderscoreAndDash) {
  EXPECT_TRUE(CheckEngineName("scale").ok());
  EXPECT_TRUE(CheckEngineName("my_engine-2").ok());
  EXPECT_TRUE(CheckEngineName(std::string(63, 'a')).ok());
  for (std::string bad : {std::string(), std::string(64, 'a'), std::string("Scale"), std::string("a.b"),
                          std::string("../scale"), std::string("a/b"), std::string(".."), std::string("a b"),
                          std::string("a\0b", 3), std::string("x.so")}) {
    Status s = CheckEngineName(bad);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
    EXPECT_TRUE(Contains(s.message(), "lower-case letters")) << s.message();
  }
}

TEST_F(PluginLoaderTest, BadNameIsRefusedBeforeTheFileSystemIsTouched) {
  // The directory does not exist: a name check that ran after a lookup would say NOT_FOUND.
  for (const char* bad : {"../engines/scale", "/etc/passwd", "Scale", "a.b"}) {
    Result<EngineSource> checked = CheckEngine(bad, root_ + "/missing");
    EXPECT_EQ(checked.status().code(), Code::kInvalidArgument) << bad;
    Result<const wp_engine_vtable*> resolved = ResolveEngine(bad, root_ + "/missing");
    EXPECT_EQ(resolved.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST_F(PluginLoaderTest, BuiltInEnginesNeedNoDirectoryAndWinOverAPluginOfTheSameName) {
  Result<EngineSource> dense = CheckEngine("dense", "");
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  EXPECT_TRUE(dense->builtin);
  EXPECT_TRUE(dense->plugin_path.empty());
  Install(ScalePlugin(), "echo");
  Result<const wp_engine_vtable*> echo = ResolveEngine("echo", dir_);
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
  EXPECT_EQ(*echo, warmpool_engine_echo());
}

TEST_F(PluginLoaderTest, WithoutAnEngineDirectoryOnlyBuiltInsExist) {
  Result<EngineSource> checked = CheckEngine("scale", "");
  EXPECT_EQ(checked.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(checked.status().message(), "engine_dir")) << checked.status().message();
  EXPECT_TRUE(Contains(checked.status().message(), "scale.so")) << checked.status().message();
  EXPECT_EQ(ResolveEngine("scale", "").status().code(), Code::kNotFound);
}

TEST_F(PluginLoaderTest, MissingDirectoryOrFileIsNotFoundAndSaysWhere) {
  Result<EngineSource> no_dir = CheckEngine("scale", root_ + "/missing");
  EXPECT_EQ(no_dir.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(no_dir.status().message(), root_ + "/missing")) << no_dir.status().message();

  Result<EngineSource> no_file = CheckEngine("foo", dir_);
  EXPECT_EQ(no_file.status().code(), Code::kNotFound);
  EXPECT_EQ(no_file.status().message(),
            "engine \"foo\" not found: no built-in engine of that name (built in: dense, echo, transformer) and no foo.so in " + dir_);
  EXPECT_EQ(ResolveEngine("foo", dir_).status().code(), Code::kNotFound);
}

TEST_F(PluginLoaderTest, SymlinkLeadingOutOfTheDirectoryIsRefused) {
  fs::create_directory(root_ + "/outside");
  chmod((root_ + "/outside").c_str(), 0755);
  std::string outside = Install(ScalePlugin(), "scale", root_ + "/outside");
  fs::create_symlink(outside, dir_ + "/scale.so");
  Result<EngineSource> checked = CheckEngine("scale", dir_);
  EXPECT_EQ(checked.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(checked.status().message(), "outside the engine directory")) << checked.status().message();
  EXPECT_EQ(ResolveEngine("scale", dir_).status().code(), Code::kFailedPrecondition);

  // The same through a relative link that climbs out with "..".
  fs::create_symlink("../outside/scale.so", dir_ + "/climb.so");
  Result<EngineSource> climbed = CheckEngine("climb", dir_);
  EXPECT_EQ(climbed.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(climbed.status().message(), "outside")) << climbed.status().message();

  // A dangling link is not a plugin either.
  fs::create_symlink(root_ + "/nowhere.so", dir_ + "/dangling.so");
  EXPECT_EQ(CheckEngine("dangling", dir_).status().code(), Code::kNotFound);
}

TEST_F(PluginLoaderTest, EngineDirectoryWithDotDotAndSymlinksInsideAreResolved) {
  fs::create_directory(dir_ + "/impl");
  chmod((dir_ + "/impl").c_str(), 0755);
  std::string real = Install(ScalePlugin(), "scale", dir_ + "/impl");
  fs::create_symlink("impl/scale.so", dir_ + "/scale.so");
  Result<EngineSource> checked = CheckEngine("scale", dir_ + "/impl/..");
  ASSERT_TRUE(checked.ok()) << checked.status().ToString();
  EXPECT_FALSE(checked->builtin);
  EXPECT_EQ(checked->plugin_path, real);

  // The subdirectory the link leads into counts as much as engine_dir itself.
  chmod((dir_ + "/impl").c_str(), 0777);
  Result<EngineSource> open_dir = CheckEngine("scale", dir_);
  EXPECT_EQ(open_dir.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(open_dir.status().message(), "writable by group or others")) << open_dir.status().message();
}

TEST_F(PluginLoaderTest, FileOrDirectoryWritableByGroupOrOthersIsRefused) {
  std::string plugin = Install(ScalePlugin(), "scale");
  for (mode_t mode : {0775, 0757, 0666}) {
    chmod(plugin.c_str(), mode);
    Result<EngineSource> checked = CheckEngine("scale", dir_);
    EXPECT_EQ(checked.status().code(), Code::kFailedPrecondition) << std::oct << mode;
    EXPECT_TRUE(Contains(checked.status().message(), "chmod go-w")) << checked.status().message();
    EXPECT_EQ(ResolveEngine("scale", dir_).status().code(), Code::kFailedPrecondition);
  }
  chmod(plugin.c_str(), 0755);
  chmod(dir_.c_str(), 0775);
  Result<EngineSource> checked = CheckEngine("scale", dir_);
  EXPECT_EQ(checked.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(checked.status().message(), "engine directory")) << checked.status().message();
  chmod(dir_.c_str(), 0755);
  EXPECT_TRUE(CheckEngine("scale", dir_).ok());
}

TEST_F(PluginLoaderTest, FileOwnedBySomeoneElseIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a file away";
  std::string plugin = Install(ScalePlugin(), "scale");
  ASSERT_EQ(chown(plugin.c_str(), 65534, 65534), 0);
  Result<EngineSource> checked = CheckEngine("scale", dir_);
  EXPECT_EQ(checked.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(checked.status().message(), "owned by uid 65534")) << checked.status().message();
}

TEST_F(PluginLoaderTest, NotARegularFileIsRefused) {
  fs::create_directory(dir_ + "/dir.so");
  EXPECT_EQ(CheckEngine("dir", dir_).status().code(), Code::kFailedPrecondition);
  ASSERT_EQ(mkfifo((dir_ + "/fifo.so").c_str(), 0644), 0);
  Result<EngineSource> fifo = CheckEngine("fifo", dir_);
  EXPECT_EQ(fifo.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(fifo.status().message(), "not a regular file")) << fifo.status().message();
}

TEST_F(PluginLoaderTest, BrokenPluginsAreRefusedWithWhatToDo) {
  struct Case {
    const char* stem;
    std::string says;
  };
  const std::string versions =
      fmt::format("implements engine ABI version 1, this warmpool loads {} to {}", WP_ENGINE_ABI_VERSION_MIN,
                  WP_ENGINE_ABI_VERSION);
  for (const Case& c : {Case{"nosym", "does not export warmpool_engine()"},
                        Case{"oldabi", versions},
                        Case{"noentry", "leaves an entry point of its vtable empty"},
                        Case{"wrongname", "calls itself \"other\", not \"wrongname\""},
                        Case{"nullvt", "returned no vtable"}}) {
    Install(BrokenPlugin(c.stem), c.stem);
    EXPECT_TRUE(CheckEngine(c.stem, dir_).ok()) << c.stem << ": the file itself is fine";
    Result<const wp_engine_vtable*> resolved = ResolveEngine(c.stem, dir_);
    EXPECT_EQ(resolved.status().code(), Code::kFailedPrecondition) << c.stem;
    EXPECT_TRUE(Contains(resolved.status().message(), c.says)) << resolved.status().message();
  }
  {
    std::ofstream garbage(dir_ + "/garbage.so");
    garbage << "not an ELF file\n";
  }
  chmod((dir_ + "/garbage.so").c_str(), 0644);
  Result<const wp_engine_vtable*> garbage = ResolveEngine("garbage", dir_);
  EXPECT_EQ(garbage.status().code(), Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(garbage.status().message(), "cannot be loaded")) << garbage.status().message();
}

// ---- the sample plugin through the whole ABI ----

std::string WriteScaleModel(const std::string& path, const std::vector<float>& scale, bool scalar = false) {
  safetensors::TensorToWrite tensor{"scale", safetensors::DType::F32,
                                    scalar ? std::vector<uint64_t>{} : std::vector<uint64_t>{scale.size()},
                                    std::vector<uint8_t>(scale.size() * sizeof(float))};
  std::memcpy(tensor.data.data(), scale.data(), tensor.data.size());
  Status written = safetensors::WriteFile(path, {tensor}, {{"engine", "scale"}});
  EXPECT_TRUE(written.ok()) << written.ToString();
  return path;
}

TEST_F(PluginLoaderTest, ScalePluginLoadsInfersExportsAndAttaches) {
  Install(ScalePlugin(), "scale");
  Result<const wp_engine_vtable*> vtable = ResolveEngine("scale", dir_);
  ASSERT_TRUE(vtable.ok()) << vtable.status().ToString();
  EXPECT_STREQ((*vtable)->name, "scale");
  Result<const wp_engine_vtable*> again = ResolveEngine("scale", dir_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *vtable) << "resolved once per process";

  std::string model = WriteScaleModel(root_ + "/m.safetensors", {1.0f, -2.0f, 0.5f, 4.0f});
  HostMemory memory;
  wp_engine_spec spec = SpecForFile("m", model.c_str(), nullptr, 0, 0);
  Result<Engine> engine = Engine::Open(*vtable, spec, memory.service());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(engine->info().weight_bytes, 16u);
  EXPECT_EQ(engine->info().workspace_bytes, 0u);
  EXPECT_EQ(engine->info().in_features, 4u);
  EXPECT_EQ(engine->info().out_features, 4u);
  uint64_t last_done = 0;
  ASSERT_TRUE(engine->Load([&](uint64_t done, uint64_t total) {
                      EXPECT_EQ(total, 16u);
                      last_done = done;
                      return true;
                    }).ok());
  EXPECT_EQ(last_done, 16u);
  EXPECT_EQ(memory.used_bytes() >= 16u, true);

  std::vector<float> input = {1, 2, 3, 4, -1, -1, 2, 0.25f};
  std::vector<float> output;
  ASSERT_TRUE(engine->Infer(input, 2, 4, output).ok());
  EXPECT_EQ(output, (std::vector<float>{1, -4, 1.5f, 16, -1, 2, 1, 1}));
  Status wrong = engine->Infer(std::vector<float>(3, 1.0f), 1, 3, output);
  EXPECT_EQ(wrong.code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong.message(), "expects 4")) << wrong.message();

  // A replica: open from the registration header alone (the file may be gone), attach the region.
  Result<wp_region> exported = engine->ExportWeights();
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  ASSERT_GE(exported->handle, 0);
  std::vector<uint8_t> header;
  ASSERT_TRUE(safetensors::ReadHeader(model, &header).ok());
  const uint64_t file_size = fs::file_size(model);
  fs::remove(model);
  HostMemory other;
  wp_engine_spec replica_spec = SpecForFile("m", model.c_str(), header.data(), header.size(), file_size);
  Result<Engine> replica = Engine::Open(*vtable, replica_spec, other.service());
  ASSERT_TRUE(replica.ok()) << replica.status().ToString();
  wp_region too_small{exported->ptr, 8, -1};
  EXPECT_EQ(replica->Attach(too_small).code(), Code::kInvalidArgument);
  wp_region imported{nullptr, 0, -1};
  ASSERT_EQ(other.service()->import(other.service()->ctx, exported->handle, exported->bytes, &imported), WP_OK);
  ASSERT_TRUE(replica->Attach(imported).ok());
  std::vector<float> replica_output;
  ASSERT_TRUE(replica->Infer(input, 2, 4, replica_output).ok());
  EXPECT_EQ(replica_output, (std::vector<float>{1, -4, 1.5f, 16, -1, 2, 1, 1}));
}

TEST_F(PluginLoaderTest, ScalePluginScalarScalesAnyWidthAndBadModelsSayWhy) {
  Install(ScalePlugin(), "scale");
  Result<const wp_engine_vtable*> vtable = ResolveEngine("scale", dir_);
  ASSERT_TRUE(vtable.ok()) << vtable.status().ToString();
  HostMemory memory;

  std::string scalar = WriteScaleModel(root_ + "/s.safetensors", {3.0f}, /*scalar=*/true);
  wp_engine_spec spec = SpecForFile("s", scalar.c_str(), nullptr, 0, 0);
  Result<Engine> engine = Engine::Open(*vtable, spec, memory.service());
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(engine->info().in_features, 0u);
  ASSERT_TRUE(engine->Load().ok());
  std::vector<float> output;
  ASSERT_TRUE(engine->Infer(std::vector<float>{1, 2, 3}, 1, 3, output).ok());
  EXPECT_EQ(output, (std::vector<float>{3, 6, 9}));

  // Cancelled by the progress callback: an error, and nothing stays allocated.
  HostMemory cancelled;
  Result<Engine> again = Engine::Open(*vtable, spec, cancelled.service());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->Load([](uint64_t, uint64_t) { return false; }).code(), Code::kUnavailable);
  EXPECT_EQ(cancelled.used_bytes(), 0u);

  // A model without a "scale" tensor.
  safetensors::TensorToWrite other{"weight", safetensors::DType::F32, {2}, std::vector<uint8_t>(8)};
  ASSERT_TRUE(safetensors::WriteFile(root_ + "/bad.safetensors", {other}, {}).ok());
  std::string bad = root_ + "/bad.safetensors";
  wp_engine_spec bad_spec = SpecForFile("bad", bad.c_str(), nullptr, 0, 0);
  Result<Engine> refused = Engine::Open(*vtable, bad_spec, memory.service());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(refused.status().message(), "no tensor \"scale\"")) << refused.status().message();

  // Not a safetensors file at all.
  {
    std::ofstream text(root_ + "/text.safetensors");
    text << "hello, this is not a model";
  }
  std::string text = root_ + "/text.safetensors";
  wp_engine_spec text_spec = SpecForFile("text", text.c_str(), nullptr, 0, 0);
  EXPECT_EQ(Engine::Open(*vtable, text_spec, memory.service()).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace warmpool
