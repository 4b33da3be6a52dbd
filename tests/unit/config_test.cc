// Daemon configuration: the TOML document on top of the defaults, the errors an operator sees for a
// typo or a wrong type, instance names, and the machine-dependent defaults.
#include "supervisor/config.h"
#include "tests/text.h"

#include <sched.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace warmpool::supervisor {
namespace {

constexpr char kOrigin[] = "/etc/warmpool/warmpool.toml";

using ::warmpool::testing::Contains;

// The message of a document that must be refused with kInvalidArgument.
std::string Refusal(const std::string& text, const std::string& origin = kOrigin) {
  Config c;
  Status s = ApplyToml(c, text, origin);
  EXPECT_FALSE(s.ok()) << "accepted:\n" << text;
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  return s.message();
}

constexpr char kFull[] = R"(
[daemon]
socket = "/run/wp/test.sock"
models_dir = "/srv/models"
backend = "host"
instance = "ci-1"
workers_per_device = 3
default_deadline_ms = 1500

[pool]
capacity = 4
budget = "2GiB"
max_queue = 64

[limits]
max_frame_bytes = "1MiB"
max_connections = 10
max_models = 32
max_inflight = 128

[[models]]
name = "mlp"
engine = "dense"
path = "weights/mlp.safetensors"

[[models]]
name = "echo"
engine = "echo"
path = "/abs/echo.bin"

[[models]]
name = "up"
path = "../shared/./up.safetensors"
)";

TEST(ApplyTomlTest, FullDocument) {
  Config c;
  Status s = ApplyToml(c, kFull, kOrigin);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.socket_path, "/run/wp/test.sock");
  EXPECT_EQ(c.models_dir, "/srv/models");
  EXPECT_EQ(c.backend, Backend::kHost);
  EXPECT_EQ(c.instance, "ci-1");
  EXPECT_EQ(c.workers_per_device, 3u);
  EXPECT_EQ(c.default_deadline_ms, 1500u);
  EXPECT_EQ(c.capacity, 4u);
  EXPECT_EQ(c.budget_bytes, 2147483648u);
  EXPECT_EQ(c.max_queue, 64u);
  EXPECT_EQ(c.max_frame_bytes, 1048576u);
  EXPECT_EQ(c.max_connections, 10u);
  EXPECT_EQ(c.max_models, 32u);
  EXPECT_EQ(c.max_inflight, 128u);
  ASSERT_EQ(c.models.size(), 3u);
  EXPECT_EQ(c.models[0].name, "mlp");
  EXPECT_EQ(c.models[0].engine, "dense");
  EXPECT_EQ(c.models[0].path, "/etc/warmpool/weights/mlp.safetensors");
  EXPECT_EQ(c.models[1].name, "echo");
  EXPECT_EQ(c.models[1].engine, "echo");
  EXPECT_EQ(c.models[1].path, "/abs/echo.bin");
  EXPECT_EQ(c.models[2].name, "up");
  EXPECT_EQ(c.models[2].engine, "") << "none given: registration decides by the file (dense, or transformer for a directory)";
  EXPECT_EQ(c.models[2].path, "/etc/shared/up.safetensors");
}

TEST(ThreadsPerWorker, ConfiguredOrTheCpusDividedAmongTheWorkers) {
  EXPECT_EQ(ThreadsPerWorker(3, 8), 3u);
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  const auto cpus = static_cast<uint32_t>(CPU_COUNT(&set));
  EXPECT_EQ(ThreadsPerWorker(0, 1), cpus);
  EXPECT_EQ(ThreadsPerWorker(0, cpus * 4), 1u) << "never fewer than one";
  EXPECT_EQ(ThreadsPerWorker(0, 2), std::max(1u, cpus / 2));
  Config config;
  ASSERT_TRUE(ApplyToml(config, "[daemon]\nthreads_per_worker = 5\n", "test").ok());
  EXPECT_EQ(config.threads_per_worker, 5u);
  // Beyond what a worker takes, every worker would fail to start, over and over: refused here.
  Status over = ApplyToml(config, "[daemon]\nthreads_per_worker = 5000\n", "test");
  EXPECT_EQ(over.code(), Code::kInvalidArgument);
  EXPECT_NE(over.message().find("from 0 to 4096"), std::string::npos) << over.message();
  EXPECT_FALSE(ApplyToml(config, "[pool]\nmax_batch_delay_us = 5000000\n", "test").ok());
  EXPECT_FALSE(ApplyToml(config, "[[models]]\nname = \"m\"\nmax_batch_delay_us = -1\n", "test").ok());
}

TEST(ApplyTomlTest, ModelAliasesAndToolCallFormats) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[[models]]\nname = \"a\"\naliases = [\"gpt-4o-mini\"]\ntool_call_format = \"hermes\"\n"
                           "[[models]]\nname = \"b\"\naliases = [\"b2\", \"b3\"]\ntool_call_format = \"none\"\n",
                        kOrigin)
                  .ok());
  ASSERT_EQ(c.models.size(), 2u);
  EXPECT_EQ(c.models[0].aliases, std::vector<std::string>{"gpt-4o-mini"});
  EXPECT_EQ(c.models[0].tool_call_format, "hermes");
  EXPECT_EQ(c.models[1].aliases.size(), 2u);
  // An alias names one model: not another's name, not twice, and only what a name may be.
  for (const char* bad : {"[[models]]\nname = \"a\"\naliases = [\"b\"]\n[[models]]\nname = \"b\"\n",
                          "[[models]]\nname = \"a\"\naliases = [\"x\"]\n[[models]]\nname = \"b\"\naliases = [\"x\"]\n",
                          "[[models]]\nname = \"a\"\naliases = [\"x\", \"x\"]\n",
                          "[[models]]\nname = \"a\"\naliases = [\"no spaces\"]\n",
                          "[[models]]\nname = \"a\"\ntool_call_format = \"mistral\"\n"}) {
    Config config;
    Status s = ApplyToml(config, bad, kOrigin);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
  }
}

// A [[models]] key given each of these values: refused, naming the key.
void ExpectModelKeyRefuses(const std::string& key, std::initializer_list<const char*> values) {
  for (const char* bad : values) {
    Config config;
    Status s = ApplyToml(config, fmt::format("[[models]]\nname = \"a\"\n{} = {}\n", key, bad), kOrigin);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << key << " = " << bad;
    EXPECT_NE(s.message().find("models." + key), std::string::npos) << s.message();
  }
}

TEST(ApplyTomlTest, ModelParallelIsOneToSixteenGenerationsAtOnce) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[[models]]\nname = \"a\"\nparallel = 8\n[[models]]\nname = \"b\"\n", kOrigin).ok());
  EXPECT_EQ(c.models[0].parallel, 8u);
  EXPECT_EQ(c.models[1].parallel, 0u) << "unset: the engine's default";
  ExpectModelKeyRefuses("parallel", {"0", "17", "-1", "\"four\"", "2.5"});
}

TEST(ApplyTomlTest, ModelKvCacheTokensArePositiveAndBounded) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[[models]]\nname = \"a\"\nkv_cache_tokens = 8192\n[[models]]\nname = \"b\"\n", kOrigin).ok());
  EXPECT_EQ(c.models[0].kv_cache_tokens, 8192u);
  EXPECT_EQ(c.models[1].kv_cache_tokens, 0u) << "unset: parallel x context";
  ExpectModelKeyRefuses("kv_cache_tokens", {"0", "-1", "\"4k\"", "1.5", "1099511627776"});
}

TEST(ApplyTomlTest, ModelPrefillStretchIsANumberFromOneToAHundred) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[[models]]\nname = \"a\"\nprefill_stretch = 3\n[[models]]\nname = \"b\"\n"
                           "prefill_stretch = 1.5\n[[models]]\nname = \"c\"\n", kOrigin).ok());
  EXPECT_EQ(c.models[0].prefill_stretch, 3.0f);
  EXPECT_EQ(c.models[1].prefill_stretch, 1.5f);
  EXPECT_EQ(c.models[2].prefill_stretch, 0.0f) << "unset: the engine's default";
  ExpectModelKeyRefuses("prefill_stretch", {"0", "0.5", "101", "-2", "\"fast\"", "nan"});
}

TEST(ApplyTomlTest, EmptyDocumentKeepsDefaults) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "", kOrigin).ok());
  Config d;
  EXPECT_EQ(c.socket_path, d.socket_path);
  EXPECT_EQ(c.backend, Backend::kAuto);
  EXPECT_EQ(c.instance, "default");
  EXPECT_EQ(c.workers_per_device, 2u);
  EXPECT_EQ(c.budget_bytes, 0u);
  EXPECT_EQ(c.max_frame_bytes, 64u << 20);
  EXPECT_TRUE(c.models.empty());
}

TEST(ApplyTomlTest, LaterDocumentsOverrideOnlyWhatTheySet) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, kFull, kOrigin).ok());
  ASSERT_TRUE(ApplyToml(c, "[pool]\ncapacity = 9\n", "/other/override.toml").ok());
  EXPECT_EQ(c.capacity, 9u);
  EXPECT_EQ(c.budget_bytes, 2147483648u);
  EXPECT_EQ(c.backend, Backend::kHost);
  EXPECT_EQ(c.models.size(), 3u);
}

TEST(ApplyTomlTest, IntegerSizesAreBytes) {
  Config c;
  Status s = ApplyToml(c, "[pool]\nbudget = 2147483648\n[limits]\nmax_frame_bytes = 4096\n", kOrigin);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.budget_bytes, 2147483648u);
  EXPECT_EQ(c.max_frame_bytes, 4096u);
  ASSERT_TRUE(ApplyToml(c, "[pool]\nbudget = \"1.5GiB\"\n", kOrigin).ok());
  EXPECT_EQ(c.budget_bytes, 1610612736u);
  ASSERT_TRUE(ApplyToml(c, "[limits]\nmax_frame_bytes = \"2GiB\"\n", kOrigin).ok());
  EXPECT_EQ(c.max_frame_bytes, 2147483648u);
}

TEST(ApplyTomlTest, RelativeModelPathWithoutADirectoryIsKept) {
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[[models]]\nname = \"a\"\npath = \"w/a.bin\"\n", "config.toml").ok());
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_EQ(c.models[0].path, "w/a.bin");
}

TEST(ApplyTomlTest, UnknownKeysAndSectionsAreNamed) {
  std::string key = Refusal("[daemon]\nsockte = \"/x\"\n");
  EXPECT_TRUE(Contains(key, "/etc/warmpool/warmpool.toml: unknown key daemon.sockte")) << key;
  EXPECT_TRUE(Contains(Refusal("[pool]\nbudgett = 1\n"), "unknown key pool.budgett"));
  EXPECT_TRUE(Contains(Refusal("[limits]\nmax_model = 1\n"), "unknown key limits.max_model"));
  std::string section = Refusal("[server]\nport = 1\n");
  EXPECT_TRUE(Contains(section, "unknown section [server]")) << section;
  EXPECT_TRUE(Contains(Refusal("verbose = true\n"), "unknown section [verbose]"));
  EXPECT_TRUE(Contains(Refusal("[[models]]\nname = \"a\"\nsize = 3\n"), "unknown key models.size"));
}

TEST(ApplyTomlTest, WrongTypesAreRefused) {
  EXPECT_TRUE(Contains(Refusal("[daemon]\nworkers_per_device = \"two\"\n"),
                       "daemon.workers_per_device must be a non-negative integer"));
  EXPECT_TRUE(Contains(Refusal("[daemon]\nworkers_per_device = 2.5\n"),
                       "daemon.workers_per_device must be a non-negative integer"));
  EXPECT_TRUE(Contains(Refusal("[daemon]\nsocket = 5\n"), "daemon.socket must be a string"));
  EXPECT_TRUE(Contains(Refusal("[daemon]\ninstance = [\"a\"]\n"), "daemon.instance must be a string"));
  EXPECT_TRUE(Contains(Refusal("[pool]\ncapacity = true\n"), "pool.capacity must be a non-negative integer"));
  EXPECT_TRUE(Contains(Refusal("[pool]\nmax_queue = 8.0\n"), "pool.max_queue must be a non-negative integer"));
  EXPECT_TRUE(Contains(Refusal("[pool]\nbudget = 2.0\n"), "pool.budget must be a size"));
  EXPECT_TRUE(Contains(Refusal("[pool]\ncapacity = -1\n"), "pool.capacity must be a non-negative integer"));
  EXPECT_TRUE(Contains(Refusal("[limits]\nmax_models = 5000000000\n"),
                       "limits.max_models must be a non-negative integer"));
  EXPECT_TRUE(Contains(Refusal("[pool]\nbudget = true\n"),
                       "pool.budget must be a size such as 2GiB or a byte count"));
  EXPECT_TRUE(Contains(Refusal("[pool]\nbudget = -5\n"), "pool.budget must not be negative"));
  std::string unit = Refusal("[pool]\nbudget = \"2 furlongs\"\n");
  EXPECT_TRUE(Contains(unit, "pool.budget: size \"2 furlongs\" has unknown unit")) << unit;
  EXPECT_TRUE(Contains(Refusal("[limits]\nmax_frame_bytes = 100\n"),
                       "limits.max_frame_bytes must be between 1KiB and 2GiB"));
  EXPECT_TRUE(Contains(Refusal("[limits]\nmax_frame_bytes = \"3GiB\"\n"),
                       "limits.max_frame_bytes must be between 1KiB and 2GiB"));
  EXPECT_TRUE(Contains(Refusal("daemon = 3\n"), "[daemon] must be a table"));
  EXPECT_TRUE(Contains(Refusal("models = 3\n"), "models must be an array of tables"));
  EXPECT_TRUE(Contains(Refusal("models = [1, 2]\n"), "each [[models]] entry must be a table"));
  EXPECT_TRUE(Contains(Refusal("[[models]]\npath = \"a.bin\"\n"), "a [[models]] entry has no name"));
  EXPECT_TRUE(Contains(Refusal("[[models]]\nname = 7\n"), "models.name must be a string"));
}

TEST(ApplyTomlTest, BadBackendIsRefused) {
  std::string m = Refusal("[daemon]\nbackend = \"gpu\"\n");
  EXPECT_TRUE(Contains(m, "daemon.backend must be auto, host or cuda, not \"gpu\"")) << m;
  for (const char* ok : {"auto", "host", "cuda"}) {
    Config c;
    EXPECT_TRUE(ApplyToml(c, std::string("[daemon]\nbackend = \"") + ok + "\"\n", kOrigin).ok()) << ok;
    EXPECT_EQ(BackendName(c.backend), ok);
  }
}

TEST(ApplyTomlTest, CudaSettings) {
  Config c;
  EXPECT_FALSE(c.cuda_tf32) << "TF32 only when asked";
  ASSERT_TRUE(ApplyToml(c, "[cuda]\nsharing = \"legacy\"\nreserve = \"2GiB\"\ntf32 = true\n", kOrigin).ok());
  EXPECT_EQ(c.cuda_sharing, "legacy");
  EXPECT_EQ(c.cuda_reserve_bytes, 2ull << 30);
  EXPECT_TRUE(c.cuda_tf32);
  EXPECT_TRUE(Contains(Refusal("[cuda]\ntf32 = \"yes\"\n"), "cuda.tf32 must be true or false"));
  EXPECT_TRUE(Contains(Refusal("[cuda]\nsharing = \"ipc\"\n"), "must be auto, vmm or legacy"));
}

TEST(ApplyTomlTest, SyntaxErrorReportsTheLine) {
  std::string m = Refusal("[daemon]\nsocket = \"/x\"\nworkers_per_device = = 3\n", "bad.toml");
  EXPECT_EQ(m.rfind("bad.toml:3:", 0), 0u) << m;
  std::string unterminated = Refusal("\n\n\n\n[pool]\nbudget = \"2GiB\n", "u.toml");
  EXPECT_EQ(unterminated.rfind("u.toml:6:", 0), 0u) << unterminated;
}

TEST(LoadConfigFileTest, ReadsAFileAndResolvesPathsAgainstItsDirectory) {
  std::string dir_template = (std::filesystem::temp_directory_path() / "wp-config-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir_template.data()), nullptr);
  std::filesystem::path dir(dir_template);
  std::filesystem::path file = dir / "warmpool.toml";
  std::ofstream(file) << "[pool]\ncapacity = 2\n[[models]]\nname = \"m\"\npath = \"m.bin\"\n";
  Config c;
  Status s = LoadConfigFile(c, file.string());
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.config_path, file.string());
  EXPECT_EQ(c.capacity, 2u);
  ASSERT_EQ(c.models.size(), 1u);
  EXPECT_EQ(c.models[0].path, (dir / "m.bin").string());
  std::filesystem::remove_all(dir);

  Config missing;
  Status m = LoadConfigFile(missing, (dir / "nope.toml").string());
  EXPECT_EQ(m.code(), Code::kNotFound);
  EXPECT_TRUE(Contains(m.message(), "cannot read config file")) << m.message();
}

TEST(CheckInstanceNameTest, AcceptsShortPortableNames) {
  for (const std::string& ok : {std::string("default"), std::string("a"), std::string("A-b_9"),
                                std::string(32, 'x')}) {
    EXPECT_TRUE(CheckInstanceName(ok).ok()) << ok;
  }
}

TEST(CheckInstanceNameTest, RefusesEverythingElse) {
  for (const std::string& bad :
       {std::string(""), std::string(33, 'x'), std::string("a/b"), std::string("a.b"),
        std::string("a b"), std::string("../x"), std::string("é"), std::string("a\nb")}) {
    Status s = CheckInstanceName(bad);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << "\"" << bad << "\"";
    EXPECT_TRUE(Contains(s.message(), "must be 1 to 32 letters, digits, '-' or '_'")) << s.message();
  }
}

}  // namespace
}  // namespace warmpool::supervisor

namespace warmpool::supervisor {
namespace {

TEST(ApplyTomlTest, KeepAliveAndPreload) {
  Config c;
  ASSERT_TRUE(ApplyToml(c,
                        "[pool]\nkeep_alive = \"5m\"\npreload = [\"a\", \"b\"]\n"
                        "[[models]]\nname = \"a\"\nkeep_alive = -1\n"
                        "[[models]]\nname = \"b\"\nkeep_alive = 30\n"
                        "[[models]]\nname = \"c\"\n",
                        "")
                  .ok());
  EXPECT_EQ(c.keep_alive_ms, 300000);
  EXPECT_EQ(c.preload, (std::vector<std::string>{"a", "b"}));
  ASSERT_EQ(c.models.size(), 3u);
  EXPECT_EQ(c.models[0].keep_alive_ms, kKeepAliveForever);
  EXPECT_EQ(c.models[1].keep_alive_ms, 30000);
  EXPECT_EQ(c.models[2].keep_alive_ms, kKeepAliveDefault);
  Config bad;
  Status s = ApplyToml(bad, "[pool]\nkeep_alive = \"soon\"\n", "x.toml");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("pool.keep_alive"), std::string::npos) << s.message();
  EXPECT_FALSE(ApplyToml(bad, "[pool]\npreload = \"a\"\n", "x.toml").ok());
}

// Found by fuzzing: an integer keep_alive is seconds, and times 1000 it overflowed int64 (undefined
// behaviour) for values above 9.2e15. Integers now have the bound of the string form (1e15 ms).
TEST(ApplyTomlTest, HugeIntegerKeepAliveIsRefusedNotOverflowed) {
  EXPECT_NE(Refusal("[pool]\nkeep_alive = 9223372036854775807\n").find("pool.keep_alive: "
                                                                       "9223372036854775807 seconds is too long"),
            std::string::npos);
  EXPECT_NE(Refusal("[[models]]\nname = \"a\"\nkeep_alive = 1000000000001\n").find("models.keep_alive"),
            std::string::npos);
  Config c;
  ASSERT_TRUE(ApplyToml(c, "[pool]\nkeep_alive = 1000000000000\n", kOrigin).ok());
  EXPECT_EQ(c.keep_alive_ms, 1'000'000'000'000'000);
  ASSERT_TRUE(ApplyToml(c, "[pool]\nkeep_alive = -9223372036854775808\n", kOrigin).ok());
  EXPECT_EQ(c.keep_alive_ms, kKeepAliveForever);
}

// Found by fuzzing, in toml++ 3.3.0 itself: asking whether U+00A1..U+0499 (and a few other ranges)
// is whitespace reaches __builtin_unreachable() (upstream marzer/tomlplusplus issues 190 and 295).
// The daemon links Debian's build of the library; these pin what it does with such documents: a
// stray character at a token boundary is a syntax error, and the one valid place the parser asks,
// after a line-ending backslash in a multi-line string, keeps the character.
TEST(ApplyTomlTest, NonAsciiWhereTomlExpectsWhitespace) {
  std::string message = Refusal("\xcf\xa5");
  EXPECT_NE(message.find(std::string(kOrigin) + ":1:1:"), std::string::npos) << message;
  Refusal("[daemon]\nsocket = \"/tmp/a.sock\" \xc3\xa9\n");
  Config c;
  Status s = ApplyToml(c, "[daemon]\nsocket = \"\"\"\\\n  \xc3\xa9t\xc3\xa9.sock\"\"\"\n", kOrigin);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(c.socket_path, "\xc3\xa9t\xc3\xa9.sock");
}

}  // namespace
}  // namespace warmpool::supervisor
