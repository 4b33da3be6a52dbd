#include "bench/torch_baseline.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "bench/skeleton.h"
#include "common/paths.h"

namespace warmpool::bench {
namespace {

std::string LastLines(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last.empty() ? "it printed nothing" : last;
}

}  // namespace

Result<std::unique_ptr<TorchBaseline>> TorchBaseline::Start(BenchRun& run, const std::string& python,
                                                            const std::string& model_path, uint32_t threads) {
  const std::string script = NextToSelf("warmpool-bench-torch.py");
  if (access(script.c_str(), R_OK) != 0) {
    return Error(Code::kFailedPrecondition, "{} is missing (the build puts it beside warmpool-bench)", script);
  }
  if (access(python.c_str(), X_OK) != 0) {
    return Error(Code::kFailedPrecondition, "cannot run {}: {}", python, std::strerror(errno));
  }
  std::unique_ptr<TorchBaseline> t(new TorchBaseline());
  t->errors_ = run.File("torch.stderr");
  int to_child[2], from_child[2];
  if (pipe2(to_child, O_CLOEXEC) != 0) return Error(Code::kInternal, "pipe: {}", std::strerror(errno));
  if (pipe2(from_child, O_CLOEXEC) != 0) {
    close(to_child[0]);
    close(to_child[1]);
    return Error(Code::kInternal, "pipe: {}", std::strerror(errno));
  }
  const std::string thread_arg = std::to_string(threads);
  pid_t pid = fork();
  if (pid < 0) return Error(Code::kInternal, "fork: {}", std::strerror(errno));
  if (pid == 0) {
    int err = open(t->errors_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (dup2(to_child[0], 0) < 0 || dup2(from_child[1], 1) < 0 || err < 0 || dup2(err, 2) < 0) _exit(127);
    // One thread means one: OpenMP and MKL-DNN read these before PyTorch's own setting applies.
    setenv("OMP_NUM_THREADS", thread_arg.c_str(), 1);
    const char* argv[] = {python.c_str(), script.c_str(), model_path.c_str(), thread_arg.c_str(), nullptr};
    execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  // Not one of run's children: those are killed by pid at the end, and this one is reaped here
  // first. If the bench dies, the child reads the end of its stdin and exits by itself.
  close(to_child[0]);
  close(from_child[1]);
  t->pid_ = pid;
  t->to_ = fdopen(to_child[1], "w");
  t->from_ = fdopen(from_child[0], "r");
  if (t->to_ == nullptr || t->from_ == nullptr) return Error(Code::kInternal, "fdopen: {}", std::strerror(errno));
  Result<std::string> ready = t->ReadLine();
  if (!ready.ok()) return ready.status();
  if (ready->rfind("ready", 0) != 0) {
    return Error(Code::kFailedPrecondition, "{} did not start: {}", script, *ready);
  }
  return t;
}

TorchBaseline::~TorchBaseline() {
  if (to_ != nullptr) std::fclose(to_);
  if (from_ != nullptr) std::fclose(from_);
  if (pid_ > 0) {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

Result<std::string> TorchBaseline::ReadLine() {
  char buffer[256];
  if (std::fgets(buffer, sizeof buffer, from_) == nullptr) {
    return Error(Code::kFailedPrecondition, "the PyTorch baseline ended: {}", LastLines(errors_));
  }
  std::string line(buffer);
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

Result<double> TorchBaseline::CallMs(uint32_t rows) {
  if (std::fprintf(to_, "%u\n", rows) < 0 || std::fflush(to_) != 0) {
    return Error(Code::kFailedPrecondition, "the PyTorch baseline ended: {}", LastLines(errors_));
  }
  Result<std::string> line = ReadLine();
  if (!line.ok()) return line.status();
  char* end = nullptr;
  const double ms = std::strtod(line->c_str(), &end);
  if (end == line->c_str()) return Error(Code::kInternal, "the PyTorch baseline answered \"{}\"", *line);
  return ms;
}

}  // namespace warmpool::bench
