#include "tests/integration/daemon_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "devmem/host_memory.h"
#include "engines/builtin.h"
#include "engines/catalog/builtin_engines.h"
#include "engines/dense_model.h"
#include "engines/safetensors.h"
#include "shm/model_index.h"
#include "shm/segment.h"

namespace warmpool::testing {

namespace fs = std::filesystem;

// The programs under test: this build's, or those WARMPOOL_BIN_DIR names (the sanitizer pass runs
// these tests against the sanitizer build's programs; the GPU check against its bundle's).
std::string BinDir() {
  const char* dir = std::getenv("WARMPOOL_BIN_DIR");
  return dir != nullptr && *dir != '\0' ? dir : WARMPOOL_BIN_DIR;
}

namespace {

std::string ReadFd(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

bool ProcessGone(pid_t pid) { return kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

int RunProgram(const std::vector<std::string>& argv, std::string* out, std::string* err,
               const std::string& input) {
  char out_path[] = "/tmp/warmpool-test-out-XXXXXX";
  char err_path[] = "/tmp/warmpool-test-err-XXXXXX";
  int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
  int in_pipe[2];
  if (pipe(in_pipe) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in_pipe[0], 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    close(in_pipe[1]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in_pipe[0]);
  if (!input.empty()) (void)!write(in_pipe[1], input.data(), input.size());
  close(in_pipe[1]);
  int status = 0;
  waitpid(pid, &status, 0);
  lseek(out_fd, 0, SEEK_SET);
  lseek(err_fd, 0, SEEK_SET);
  if (out != nullptr) *out = ReadFd(out_fd);
  if (err != nullptr) *err = ReadFd(err_fd);
  close(out_fd);
  close(err_fd);
  unlink(out_path);
  unlink(err_path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void DaemonTest::SetUp() {
  char tmpl[] = "/tmp/warmpool-it-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  dir_ = tmpl;
  models_dir_ = dir_ + "/models";
  fs::create_directories(models_dir_);
  socket_ = dir_ + "/warmpool.sock";
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  instance_ = "it-" + std::to_string(getpid()) + "-" + std::to_string(std::hash<std::string>{}(
                                                           std::string(info->name())) % 100000);
}

void DaemonTest::TearDown() {
  if (daemon_ && daemon_->running()) {
    ExpectQuiescentAndValid();
    EXPECT_EQ(StopDaemon(), 0) << DaemonLog();
  }
  EXPECT_FALSE(fs::exists("/dev/shm/warmpool." + instance_)) << "segment left behind";
  EXPECT_FALSE(fs::exists(socket_)) << "socket left behind";
  for (pid_t pid : seen_workers_) EXPECT_TRUE(ProcessGone(pid)) << "worker " << pid << " outlived the daemon";
  if (HasFailure()) std::fprintf(stderr, "--- daemon log ---\n%s\n", DaemonLog().c_str());
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void DaemonTest::StartDaemon(const std::string& extra_toml, std::vector<std::string> extra_args) {
  {
    std::ofstream config(dir_ + "/config.toml");
    config << "[daemon]\nworkers_per_device = 2\n" << extra_toml << "\n";
  }
  std::vector<std::string> args = {"--config", dir_ + "/config.toml", "--models-dir", models_dir_};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  Launch(std::move(args));
}

void DaemonTest::StartDaemonWithDefaults() { Launch({}); }

void DaemonTest::Launch(std::vector<std::string> args) {
  args.insert(args.begin(), {"--instance", instance_});
  args.insert(args.begin(), BinDir() + "/warmpoold");
  LaunchCommand(std::move(args));
}

void DaemonTest::LaunchCommand(std::vector<std::string> argv) {
  launch::DaemonSpec spec;
  spec.binary = argv.front();
  spec.directory = dir_;
  spec.socket = socket_;
  spec.socket_passed = spec.binary == BinDir() + "/warmpoold";
  spec.args.assign(argv.begin() + 1, argv.end());
  spec.env = launch_env_;
  if (service_manager_ != nullptr) service_manager_->PrepareStart(spec);
  spec.nofile = launch_nofile_;
  daemon_ = std::make_unique<launch::DaemonProcess>(spec);
  Status started = daemon_->Start();
  ASSERT_TRUE(started.ok()) << started.ToString();
  Status ready = daemon_->WaitReady(10000, /*workers_idle=*/true);
  if (!ready.ok()) daemon_.reset();
  ASSERT_TRUE(ready.ok()) << ready.ToString();
  WorkerPids();
}

int DaemonTest::StopDaemon() { return daemon_ ? daemon_->Stop() : -1; }

int DaemonTest::WaitForExit() { return daemon_ ? daemon_->Wait() : -1; }

void DaemonTest::KillDaemon() {
  if (!daemon_) return;
  daemon_->Kill();
  // Its workers die with it (PR_SET_PDEATHSIG) and are reaped by whoever inherits them: give that
  // a moment, as a service manager's restart would take. The exit can wait seconds for a CPU on a
  // loaded machine: the bound is generous and the loop ends as soon as they are gone.
  for (int i = 0; i < 2000; i++) {
    bool any = false;
    for (pid_t pid : seen_workers_) any = any || !ProcessGone(pid);
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string DaemonTest::MakeModel(const std::string& name, const std::string& layers,
                                  const std::string& activation, const std::string& dtype,
                                  int seed) {
  std::string path = models_dir_ + "/" + name + ".safetensors";
  std::string err;
  int rc = RunProgram({BinDir() + "/warmpool-mkmodel", path, "--layers", layers, "--activation",
                       activation, "--dtype", dtype, "--seed", std::to_string(seed)},
                      nullptr, &err);
  EXPECT_EQ(rc, 0) << err;
  return path;
}

uint64_t DaemonTest::AccountedBytes(const std::string& path) {
  auto header = safetensors::ReadHeader(path);
  EXPECT_TRUE(header.ok()) << header.status().ToString();
  auto model = dense::DescribeModel(*header, path);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  return header->data_bytes + dense::WorkspaceBytes(dense::ScratchFor(*model));
}

std::unique_ptr<client::Client> DaemonTest::Connect() {
  auto c = client::Client::Connect(socket_);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

int DaemonTest::Cli(const std::vector<std::string>& args, std::string* out, std::string* err,
                    const std::string& input) {
  std::vector<std::string> argv = {BinDir() + "/warmpool", "--socket", socket_};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunProgram(argv, out, err, input);
}

void DaemonTest::ExpectQuiescentAndValid() {
  auto c = client::Client::Connect(socket_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int i = 0; i < 400; i++) {
    auto s = (*c)->GetStatus();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto ps = (*c)->Ps();
    ASSERT_TRUE(ps.ok());
    bool busy = s->inflight() != 0 || s->queued() != 0;
    for (const auto& m : ps->models()) busy = busy || m.state() == "loading" || m.state() == "unloading";
    for (const auto& w : s->workers()) busy = busy || w.state() == "starting" || w.state() == "dead";
    if (!busy) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  auto segment = shm::SharedSegment::Open(instance_, /*read_only=*/true);
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  Status valid = shm::Validate(segment->view());
  EXPECT_TRUE(valid.ok()) << valid.ToString();
}

std::vector<pid_t> DaemonTest::WorkerPids() {
  std::vector<pid_t> pids;
  auto c = client::Client::Connect(socket_);
  if (!c.ok()) return pids;
  auto s = (*c)->GetStatus();
  if (!s.ok()) return pids;
  for (const auto& w : s->workers()) {
    pids.push_back(w.pid());
    if (std::find(seen_workers_.begin(), seen_workers_.end(), w.pid()) == seen_workers_.end()) {
      seen_workers_.push_back(w.pid());
    }
  }
  return pids;
}

std::string DaemonTest::DaemonLog() const {
  std::ifstream in(dir_ + "/daemon.log");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

client::Matrix ReferenceInfer(const std::string& path, const client::Matrix& input) {
  HostMemory memory;
  wp_engine_spec spec = SpecForFile("reference", path.c_str(), nullptr, 0, 0);
  auto engine = Engine::Open(FindBuiltinEngine("dense"), spec, memory.service());
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_TRUE(engine->Load().ok());
  client::Matrix out;
  Status s = engine->Infer(input.data, input.rows, input.cols, out.data);
  EXPECT_TRUE(s.ok()) << s.ToString();
  out.rows = input.rows;
  out.cols = engine->OutputColumns(input.cols);
  return out;
}

client::Matrix RandomMatrix(uint32_t rows, uint32_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  client::Matrix m{rows, cols, std::vector<float>(uint64_t{rows} * cols)};
  for (float& v : m.data) v = dist(rng);
  return m;
}

void ExpectNear(const client::Matrix& expected, const client::Matrix& actual, float tolerance) {
  ASSERT_EQ(expected.rows, actual.rows);
  ASSERT_EQ(expected.cols, actual.cols);
  for (size_t i = 0; i < expected.data.size(); i++) {
    ASSERT_NEAR(expected.data[i], actual.data[i], tolerance * (1 + std::fabs(expected.data[i])))
        << "element " << i;
  }
}

Result<uint64_t> SendInfer(client::Client& c, const std::string& model, const client::Matrix& input,
                           uint32_t deadline_ms) {
  return c.SendInfer(model, input, client::InferOptions{deadline_ms, std::nullopt});
}

void ExpectInferReply(const Result<v1::Envelope>& reply, const client::Matrix& expected) {
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  ASSERT_TRUE(reply->has_infer_reply()) << reply->DebugString();
  auto out = client::FromTensor(reply->infer_reply().output());
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ExpectNear(expected, *out);
}

}  // namespace warmpool::testing
