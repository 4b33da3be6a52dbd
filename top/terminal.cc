#include "top/terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace warmpool::top {

namespace {

constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH, SIGTSTP, SIGCONT};
constexpr char kEnter[] = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";  // alternate screen, cursor hidden
constexpr char kLeave[] = "\x1b[?25h\x1b[?1049l";

// The handler only writes the signal's number into a pipe that Wait polls (the loop does the
// work); it is the one thing a handler may safely do here.
int g_wake_fd = -1;
struct sigaction g_previous[std::size(kCaught)];

void OnSignal(int signal) {
  const int saved_errno = errno;
  const char byte = static_cast<char>(signal);
  if (g_wake_fd >= 0) (void)!write(g_wake_fd, &byte, 1);
  errno = saved_errno;
}

void CatchSignals() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < std::size(kCaught); i++) sigaction(kCaught[i], &action, &g_previous[i]);
}

void RestoreSignals() {
  for (size_t i = 0; i < std::size(kCaught); i++) sigaction(kCaught[i], &g_previous[i], nullptr);
}

void WriteAll(const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(STDOUT_FILENO, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the terminal is gone: nothing left to show it on
    done += static_cast<size_t>(n);
  }
}

int MillisUntil(std::chrono::steady_clock::time_point until) {
  const auto left =
      std::chrono::ceil<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 3600 * 1000));
}

}  // namespace

Result<std::unique_ptr<Terminal>> Terminal::Enter() {
  if (!isatty(STDOUT_FILENO)) return Error(Code::kFailedPrecondition, "stdout is not a terminal");
  if (g_wake_fd >= 0) return Error(Code::kInternal, "the terminal is already taken over");
  std::unique_ptr<Terminal> terminal(new Terminal());
  if (pipe2(terminal->wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Error(Code::kInternal, "pipe: {}", std::strerror(errno));
  }
  terminal->raw_input_ = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &terminal->saved_) == 0;
  terminal->keys_ = terminal->raw_input_;
  g_wake_fd = terminal->wake_pipe_[1];
  CatchSignals();
  terminal->TakeOver();
  return terminal;
}

Terminal::~Terminal() {
  GiveBack();
  RestoreSignals();
  g_wake_fd = -1;
  close(wake_pipe_[0]);
  close(wake_pipe_[1]);
}

void Terminal::TakeOver() {
  if (raw_input_) {
    // Keys arrive one at a time and are not echoed; ISIG stays, so Ctrl-C and Ctrl-Z still raise
    // their signals (caught above), and output processing stays, so "\n" still returns the
    // carriage.
    termios raw = saved_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &raw);
  }
  WriteAll(kEnter);
  taken_ = true;
}

void Terminal::GiveBack() {
  if (!taken_) return;
  WriteAll(kLeave);
  if (raw_input_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  taken_ = false;
}

void Terminal::Suspend() {
  // Ctrl-Z: hand the terminal back, stop as the default action would, and take it over again
  // when the shell resumes us (raise returns then).
  GiveBack();
  struct sigaction stop {};
  stop.sa_handler = SIG_DFL;
  sigemptyset(&stop.sa_mask);
  struct sigaction ours {};
  sigaction(SIGTSTP, &stop, &ours);
  raise(SIGTSTP);
  sigaction(SIGTSTP, &ours, nullptr);
  TakeOver();
}

Terminal::Size Terminal::size() const {
  winsize ws{};
  Size size;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 && ws.ws_row > 0) {
    size.columns = ws.ws_col;
    size.rows = ws.ws_row;
  }
  return size;
}

void Terminal::Draw(const std::vector<std::string>& lines) {
  // Home, each line followed by clear-to-end-of-line, then clear below: no blank flash between
  // frames. No newline after the last line, which would scroll a full screen.
  std::string out = "\x1b[H";
  for (size_t i = 0; i < lines.size(); i++) {
    out += lines[i];
    out += "\x1b[K";
    if (i + 1 < lines.size()) out += "\r\n";
  }
  out += "\x1b[J";
  WriteAll(out);
}

Terminal::Wake Terminal::OnSignals() {
  char signals[64];
  ssize_t n = read(wake_pipe_[0], signals, sizeof(signals));
  Wake wake = Wake::kTimeout;
  for (ssize_t i = 0; i < n; i++) {
    switch (signals[i]) {
      case SIGWINCH:
      case SIGCONT:
        wake = Wake::kRedraw;
        break;
      case SIGTSTP:
        Suspend();
        wake = Wake::kRedraw;
        break;
      default:
        return Wake::kQuit;
    }
  }
  return wake;
}

bool Terminal::OnKeys() {
  char keys[64];
  ssize_t n = read(STDIN_FILENO, keys, sizeof(keys));
  if (n == 0) keys_ = false;  // end of input: nothing more to read, only signals end top now
  for (ssize_t i = 0; i < n; i++) {
    if (keys[i] == 'q' || keys[i] == 'Q') return true;
  }
  return false;
}

Terminal::Wake Terminal::Wait(std::chrono::steady_clock::time_point until, int watched_fd) {
  for (;;) {
    pollfd fds[3] = {{wake_pipe_[0], POLLIN, 0},
                     {keys_ ? STDIN_FILENO : -1, POLLIN, 0},
                     {watched_fd, POLLIN, 0}};
    int ready = poll(fds, 3, MillisUntil(until));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return Wake::kTimeout;
    if (fds[0].revents != 0) {
      if (Wake wake = OnSignals(); wake != Wake::kTimeout) return wake;
    }
    if (fds[1].revents != 0 && OnKeys()) return Wake::kQuit;
    if (fds[2].revents != 0) return Wake::kWatched;
  }
}

}  // namespace warmpool::top
