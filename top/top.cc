#include "top/top.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <thread>

#include "top/terminal.h"
#include "top/top_source.h"
#include "top/top_tracker.h"
#include "top/top_view.h"
#include "common/clock.h"

namespace warmpool::top {

namespace {

using Clock = std::chrono::steady_clock;

int Fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
  return 1;
}

// One run of top: its source (replaced when the daemon comes back after going away), the
// tracker's memory and the frame last shown.
class TopSession {
 public:
  TopSession(const TopOptions& options, std::unique_ptr<PoolSource> source,
             std::unique_ptr<Terminal> terminal)
      : options_(options), terminal_(std::move(terminal)) {
    UseSource(std::move(source));
  }

  int Run();

 private:
  Clock::duration Interval() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options_.interval_seconds));
  }
  // Takes a sample and makes it the frame; UNAVAILABLE when the daemon is gone.
  Status Refresh();
  void LoseDaemon(const Status& why);
  void TryReconnect();
  void UseSource(std::unique_ptr<PoolSource> source);
  void Show();
  // What to wait for until the next refresh; false when top should end.
  bool WaitUntil(Clock::time_point deadline);

  TopOptions options_;
  std::unique_ptr<PoolSource> source_;
  std::unique_ptr<Terminal> terminal_;  // null: plain output
  Tracker tracker_;
  Frame frame_;
  ViewContext context_;
  uint64_t blocks_printed_ = 0;
};

void TopSession::UseSource(std::unique_ptr<PoolSource> source) {
  source_ = std::move(source);
  const DaemonInfo& daemon = source_->daemon();
  context_.version = daemon.version;
  context_.backend = daemon.backend;
  context_.instance = daemon.instance;
  context_.socket_reason = daemon.socket_reason;
  context_.alert.clear();
  context_.refresh_seconds = options_.interval_seconds;
}

Status TopSession::Refresh() {
  Result<PoolSample> sample = source_->Sample();
  if (!sample.ok()) return sample.status();
  frame_ = tracker_.Next(std::move(*sample));
  return OkStatus();
}

void TopSession::LoseDaemon(const Status& why) {
  tracker_.Note(UnixNanos(), why.message());
  source_.reset();
  context_.alert = fmt::format("{}; below is what it last showed; retrying {} every {:g}s",
                               why.message(), options_.socket, options_.interval_seconds);
  frame_.events = tracker_.Events();
}

void TopSession::TryReconnect() {
  Result<std::unique_ptr<PoolSource>> source = PoolSource::Connect(options_.socket);
  if (!source.ok()) return;  // still gone: the alert stands
  UseSource(std::move(*source));
  // A new daemon's counters start from zero: comparing them with the old one's would be nonsense.
  tracker_.Forget();
  const DaemonInfo& daemon = source_->daemon();
  tracker_.Note(UnixNanos(), daemon.pid != 0 ? fmt::format("warmpoold (pid {}) is back", daemon.pid)
                                             : std::string("warmpoold is back"));
  if (Status s = Refresh(); !s.ok()) LoseDaemon(s);
}

void TopSession::Show() {
  context_.now_unix_ns = UnixNanos();
  if (terminal_) {
    const Terminal::Size size = terminal_->size();
    terminal_->Draw(RenderFrame(frame_, context_, size.columns, size.rows));
    return;
  }
  std::string block = blocks_printed_++ == 0 ? "" : "\n";
  for (const std::string& line : RenderFrame(frame_, context_, 0, 0)) block += line + "\n";
  std::fwrite(block.data(), 1, block.size(), stdout);
  std::fflush(stdout);  // a pipe or a file sees each block as it is made
}

bool TopSession::WaitUntil(Clock::time_point deadline) {
  if (!terminal_) {
    std::this_thread::sleep_until(deadline);
    return true;
  }
  for (;;) {
    switch (terminal_->Wait(deadline, source_ ? source_->exit_fd() : -1)) {
      case Terminal::Wake::kQuit:
        return false;
      case Terminal::Wake::kRedraw:
        Show();
        continue;
      case Terminal::Wake::kWatched:  // the daemon exited: say so now, not at the next tick
      case Terminal::Wake::kTimeout:
        return true;
    }
  }
}

int TopSession::Run() {
  if (Status s = Refresh(); !s.ok()) return Fail(s);
  uint64_t shown = 0;
  // On a terminal the first sample is drawn at once (its rates wait for the next one); plain
  // output prints a block only once it covers an interval, so that even --once has rates.
  if (terminal_) {
    Show();
    shown++;
  }
  Clock::time_point deadline = Clock::now() + Interval();
  while (options_.iterations == 0 || shown < options_.iterations) {
    if (!WaitUntil(deadline)) break;
    // Ticks on a fixed grid (no drift from the time a refresh takes), but never a burst to catch
    // up.
    deadline = std::max(deadline + Interval(), Clock::now());
    if (source_) {
      if (Status s = Refresh(); !s.ok()) {
        // Plain output feeds scripts and logs: they learn of it from the exit status. A person
        // at a terminal is better served by a view that waits for the daemon to come back.
        if (!terminal_)
          return Fail(
              Error(Code::kUnavailable, "{} (watched at {})", s.message(), options_.socket));
        LoseDaemon(s);
      }
    } else {
      TryReconnect();
    }
    Show();
    shown++;
  }
  return 0;
}

}  // namespace

int RunTop(const TopOptions& options) {
  // Connect before taking the screen over, so that "no daemon" is said on the normal screen.
  Result<std::unique_ptr<PoolSource>> source = PoolSource::Connect(options.socket);
  if (!source.ok()) return Fail(source.status());
  std::unique_ptr<Terminal> terminal;
  if (isatty(STDOUT_FILENO)) {
    Result<std::unique_ptr<Terminal>> entered = Terminal::Enter();
    if (!entered.ok()) return Fail(entered.status());
    terminal = std::move(*entered);
  }
  TopSession session(options, std::move(*source), std::move(terminal));
  return session.Run();
}

}  // namespace warmpool::top
