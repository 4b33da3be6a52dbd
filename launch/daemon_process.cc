#include "launch/daemon_process.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/client.h"
#include "client/ready.h"

namespace warmpool::launch {

namespace {

// waitpid with a deadline (-1: none); true when the child was reaped (status filled).
bool WaitFor(pid_t pid, int timeout_ms, int& status) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    pid_t r = waitpid(pid, &status, timeout_ms < 0 ? 0 : WNOHANG);
    if (r == pid) return true;
    if (r < 0 && errno != EINTR) return true;  // not our child any more
    if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return fmt::format("was killed by signal {}", WTERMSIG(status));
  return fmt::format("ended with wait status {}", status);
}

DaemonProcess::DaemonProcess(DaemonSpec spec) : spec_(std::move(spec)) {
  if (spec_.log.empty()) spec_.log = spec_.directory + "/daemon.log";
}

DaemonProcess::~DaemonProcess() { Kill(); }

Status DaemonProcess::Start() {
  if (access(spec_.binary.c_str(), X_OK) != 0) {
    return Error(Code::kFailedPrecondition, "warmpoold binary {} is missing or not executable",
                 spec_.binary);
  }
  std::vector<std::string> args = {spec_.binary};
  if (spec_.socket_passed) args.insert(args.end(), {"--socket", spec_.socket});
  if (!spec_.instance.empty()) args.insert(args.end(), {"--instance", spec_.instance});
  if (!spec_.config.empty()) args.insert(args.end(), {"--config", spec_.config});
  if (!spec_.models_dir.empty()) args.insert(args.end(), {"--models-dir", spec_.models_dir});
  args.insert(args.end(), spec_.args.begin(), spec_.args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = spec_.env;  // copied before fork: the child only putenv()s
  std::vector<int> listen_fds;
  if (!spec_.listen_fds.empty()) {
    std::string names;
    for (const auto& [fd, name] : spec_.listen_fds) {
      listen_fds.push_back(fd);
      names += (names.empty() ? "" : ":") + name;
    }
    env.push_back("LISTEN_FDS=" + std::to_string(listen_fds.size()));
    env.push_back("LISTEN_FDNAMES=" + names);
  }
  // Written in the child, which only knows its pid after the fork: digits in place of the zeros.
  std::string listen_pid = "LISTEN_PID=00000000000000000000";
  int log = open(spec_.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return Error(Code::kInternal, "cannot open {}: {}", spec_.log, std::strerror(errno));
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(log);
    return Error(Code::kInternal, "fork: {}", std::strerror(err));
  }
  if (pid == 0) {
    // Only async-signal-safe calls until exec, or close to it.
    if (spec_.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (getppid() != parent) _exit(127);
    }
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, STDIN_FILENO);
    dup2(log, STDOUT_FILENO);
    dup2(log, STDERR_FILENO);
    if (!spec_.directory.empty() && chdir(spec_.directory.c_str()) != 0) _exit(127);
    for (std::string& kv : env) putenv(kv.data());
    if (!listen_fds.empty()) {
      // Out of the way first (a source may sit where another one goes), then to 3, 4, ...; dup2
      // clears close-on-exec.
      const int n = static_cast<int>(listen_fds.size());
      for (int& fd : listen_fds) fd = fcntl(fd, F_DUPFD_CLOEXEC, 3 + n);
      for (int i = 0; i < n; i++) {
        if (listen_fds[i] < 0 || dup2(listen_fds[i], 3 + i) < 0) _exit(127);
        close(listen_fds[i]);
      }
      char* digits = listen_pid.data() + std::strlen("LISTEN_PID=");
      unsigned long pid_value = static_cast<unsigned long>(getpid());
      char reversed[24];
      int len = 0;
      do {
        reversed[len++] = static_cast<char>('0' + pid_value % 10);
        pid_value /= 10;
      } while (pid_value != 0);
      for (int i = 0; i < len; i++) digits[i] = reversed[len - 1 - i];
      digits[len] = '\0';
      putenv(listen_pid.data());
    }
    if (spec_.nofile != 0) {
      rlimit limit{spec_.nofile, spec_.nofile};
      setrlimit(RLIMIT_NOFILE, &limit);
    }
    execv(argv[0], argv.data());
    const char msg[] = "exec of warmpoold failed\n";
    (void)!write(STDERR_FILENO, msg, sizeof(msg) - 1);
    _exit(127);
  }
  close(log);
  pid_ = pid;
  return OkStatus();
}

Status DaemonProcess::WaitReady(int timeout_ms, bool workers_idle) {
  client::ReadyWait wait;
  wait.wait_ms = timeout_ms;
  wait.workers_idle = workers_idle;
  wait.still_starting = [this]() -> Status {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return Error(Code::kUnavailable, "warmpoold {} at start; its log:\n{}", DescribeExit(status), LogTail());
    }
    return OkStatus();
  };
  Result<std::unique_ptr<client::Client>> ready = client::ConnectWhenReady(spec_.socket, wait);
  if (ready.ok()) return OkStatus();
  if (pid_ < 0) return ready.status();  // it exited: the message has its log already
  return Error(ready.status().code(), "{}; its log:\n{}", ready.status().message(), LogTail());
}

int DaemonProcess::Stop(int timeout_ms) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  return Wait(timeout_ms);
}

int DaemonProcess::Wait(int timeout_ms) {
  if (pid_ <= 0) return -1;
  int status = 0;
  if (!WaitFor(pid_, timeout_ms, status)) {
    Kill();
    return -1;
  }
  pid_ = -1;
  return ExitCode(status);
}

void DaemonProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int status = 0;
  WaitFor(pid_, 5000, status);
  pid_ = -1;
}

std::string DaemonProcess::Log() const {
  std::ifstream in(spec_.log, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string DaemonProcess::LogTail(size_t max_bytes) const {
  std::string text = Log();
  if (text.empty()) return "(empty log)";
  if (text.size() > max_bytes) text = "..." + text.substr(text.size() - max_bytes);
  return text;
}

namespace {

bool CommandLineHolds(pid_t pid, const std::vector<std::string>& args) {
  if (args.empty()) return true;
  std::ifstream file("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> words;
  for (std::string word; std::getline(file, word, '\0');) words.push_back(word);
  return std::search(words.begin(), words.end(), args.begin(), args.end()) != words.end();
}

}  // namespace

pid_t ChildNamed(pid_t parent, const std::string& name, const std::vector<std::string>& args) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr || parent <= 0) {
    if (proc != nullptr) closedir(proc);
    return -1;
  }
  pid_t found = -1;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    // /proc/PID/stat: "pid (comm) state ppid ...", comm may itself hold spaces and parentheses.
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t open = line.find('(');
    const size_t close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos || line.compare(open + 1, close - open - 1, name) != 0) {
      continue;
    }
    if (static_cast<pid_t>(std::atoi(line.c_str() + close + 4)) == parent && CommandLineHolds(pid, args)) {
      found = pid;
    }
  }
  closedir(proc);
  return found;
}

}  // namespace warmpool::launch
