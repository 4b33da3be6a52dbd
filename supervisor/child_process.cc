#include "supervisor/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "ipc/exit_status.h"

extern char** environ;

namespace warmpool::supervisor {

std::vector<char*> ChildEnvironment() {
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; e++) {
    if (std::strncmp(*e, "NOTIFY_SOCKET=", 14) == 0 || std::strncmp(*e, "LISTEN_", 7) == 0 ||
        std::strncmp(*e, "WATCHDOG_", 9) == 0) {
      continue;
    }
    env.push_back(*e);
  }
  env.push_back(nullptr);
  return env;
}

namespace {

// uv_spawn's result: 0, or a libuv error (the handle is initialised either way and must be closed).
int Spawn(uv_loop_t* loop, uv_process_t* process, const std::vector<std::string>& args, int channel_fd,
          uv_exit_cb on_exit) {
  std::vector<std::string> owned = args;
  std::vector<char*> argv;
  for (std::string& a : owned) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> env = ChildEnvironment();
  uv_stdio_container_t stdio[4];
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_INHERIT_FD;
  stdio[1].data.fd = 1;
  stdio[2].flags = UV_INHERIT_FD;
  stdio[2].data.fd = 2;
  stdio[3].flags = UV_INHERIT_FD;
  stdio[3].data.fd = channel_fd;
  uv_process_options_t options{};
  options.file = argv[0];
  options.args = argv.data();
  options.env = env.data();
  options.stdio = stdio;
  options.stdio_count = 4;
  options.exit_cb = on_exit;
  return uv_spawn(loop, process, &options);
}

}  // namespace

ChildWithChannel::~ChildWithChannel() {
  if (channel_ != nullptr) {
    ipc::Connection* channel = channel_;
    channel_ = nullptr;
    closing_channel_ = true;
    channel->Close(OkStatus());
  }
  if (running_ && pid_ > 0) kill(pid_, SIGKILL);
  // process_'s handle is closed by its UvHandle: no exit callback reaches a destroyed object.
}

std::optional<StartFailure> ChildWithChannel::Start(const std::vector<std::string>& args,
                                                    ipc::Connection::Options channel, Callbacks callbacks) {
  if (running_) return StartFailure{"already running", false};
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return StartFailure{std::string("socketpair: ") + std::strerror(errno), false};
  }
  process_ = std::make_unique<ipc::UvHandle<uv_process_t>>();
  process_->get()->data = this;
  const int rc = Spawn(loop_, process_->get(), args, fds[1], [](uv_process_t* process, int64_t exit_status,
                                                              int term_signal) {
    static_cast<ChildWithChannel*>(process->data)->OnExit(exit_status, term_signal);
  });
  close(fds[1]);
  // uv_spawn initialises the handle even when it fails; it must be closed either way.
  process_->MarkInitialized();
  if (rc != 0) {
    process_.reset();
    close(fds[0]);
    const bool hopeless = rc == UV_ENOENT || rc == UV_EACCES || rc == UV_ENOTDIR || rc == UV_ELOOP;
    return StartFailure{uv_strerror(rc), hopeless};
  }
  callbacks_ = std::move(callbacks);
  pid_ = process_->get()->pid;
  running_ = true;
  closing_channel_ = false;
  kill_reason_.clear();

  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  // The handlers hold `this`: the Connection is closed before this object goes (destructor,
  // OnExit), and a closed Connection calls no handler again.
  channel_ = ipc::Connection::Open(
      loop_, fds[0], std::move(channel),
      [this](std::string_view body) {
        if (callbacks_.on_frame) callbacks_.on_frame(body);
      },
      [this](const Status& why) {
        channel_ = nullptr;
        // An EOF nobody asked for with the process still there (it closed descriptor 3, or is
        // wedged): make the exit certain, and learn of it from the kernel.
        if (closing_channel_ || !running_ || pid_ <= 0) return;
        if (callbacks_.on_channel_lost) callbacks_.on_channel_lost(why);
        kill(pid_, SIGKILL);
      });
  return std::nullopt;
}

void ChildWithChannel::OnExit(int64_t exit_status, int term_signal) {
  ChildEnd end;
  end.plain = term_signal != 0 ? fmt::format("killed by signal {} ({})", term_signal, strsignal(term_signal))
                               : fmt::format("exited with status {}", exit_status);
  end.why = kill_reason_.empty() ? end.plain : fmt::format("was killed by the supervisor: {}", kill_reason_);
  end.exit_code = term_signal != 0 ? 128 + term_signal : static_cast<int32_t>(exit_status);
  end.fatal = ipc::IsFatalExit(exit_status, term_signal);
  running_ = false;
  // The exit can be reported before the channel was read: what the child wrote before it died
  // (finished replies, a fault's firing, an allocation's answer) is read first.
  if (channel_ != nullptr) channel_->Drain();
  if (channel_ != nullptr) {
    ipc::Connection* channel = channel_;
    channel_ = nullptr;
    closing_channel_ = true;
    channel->Close(OkStatus());
  }
  // Inside the handle's own exit callback: UvHandle closes it, the memory goes in the close callback.
  process_.reset();
  pid_ = 0;
  // Last, and nothing of this object is touched after it: the owner may start the child again.
  if (callbacks_.on_exit) callbacks_.on_exit(end);
}

bool ChildWithChannel::Send(std::string frame, const std::vector<int>& fds) {
  if (channel_ == nullptr) return false;
  channel_->Send(std::move(frame), fds);
  return true;
}

void ChildWithChannel::Kill(const std::string& reason) {
  if (!running_ || pid_ <= 0) return;
  if (kill_reason_.empty()) kill_reason_ = reason.empty() ? "asked to" : reason;
  kill(pid_, SIGKILL);
}

void ChildWithChannel::Terminate() {
  if (running_ && pid_ > 0) kill(pid_, SIGTERM);
}

void ChildWithChannel::CloseChannel() {
  if (channel_ == nullptr) return;
  ipc::Connection* channel = channel_;
  channel_ = nullptr;
  closing_channel_ = true;
  channel->Close(OkStatus());
}

bool ChildWithChannel::DrainIfReadable() {
  if (channel_ == nullptr || channel_->closing()) return false;
  pollfd p{channel_->fd(), POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  channel_->Drain();
  return true;
}

int ChildWithChannel::TakeFd() { return channel_ != nullptr ? channel_->TakeFd() : -1; }

}  // namespace warmpool::supervisor
